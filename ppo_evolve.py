"""PPO with evolving hyperparameters: an evolutionary search
in the manner of AgileRL over PPO's learning rate (1e-4 to
3e-3), entropy bonus (1e-4 to 0.03), clip range (0.1 to 0.3)
and GAE lambda (0.9 to 0.99).

    python ppo_evolve.py  # CartPole, 6 members, 1-2 minutes
    python ppo_evolve.py --no-evolve  # the control
    python ppo_evolve.py --eval runs/<run> --gif best.gif

Each generation every member trains with its own values, then
plays new episodes whose mean return is its fitness, a noisy
score. The elite (the fittest) keeps its place and trains on;
each of the other places goes to a copy of a tournament winner,
weights and Adam's state included, with one value mutated,
where population-based training (Jaderberg et al., 2017)
would replace only the worst. The fittest ever scored is kept for
--eval. Members train side by side (--workers), on any task
with a flat Box observation and Discrete, MultiDiscrete,
MultiBinary or Box actions. Tags such as [core-7] number the
details of "The 37 Implementation Details of PPO" (Huang et
al., 2022; README). Left out: annealing (core-4) and the KL
stop (aux-3), as evolution sets the rate and clip range, and
normalization (cont-6 to cont-9).
"""
import argparse
import copy
import io
import json
import math
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, fields, replace
from functools import partial

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from filelock import FileLock, Timeout
from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete
from torch.distributions import Bernoulli, Categorical, Independent, Normal
from tqdm import tqdm

SCRIPT = "ppo_evolve"  # in every checkpoint
FORMAT = 7  # the checkpoint's layout
# The evolved hyperparameters' ranges, around values PPO works
# with: drawn log-uniformly at first (lambda as 1 - lambda, from
# 0.01 to 0.1: on_scale), kept inside by mutation. The rate's
# floor is 1e-4: early on, a member with a lower rate, barely
# learning, can win tournaments by luck and fill the population.
HPARAMS = dict(learning_rate=(1e-4, 3e-3), ent_coef=(1e-4, 0.03),
               clip_coef=(0.1, 0.3), gae_lambda=(0.9, 0.99))

def on_scale(name, value):
    """Draws and mutations take GAE's lambda as 1 - lambda, the
    inverse of its horizon: x1.2 takes 0.95 to 0.94, not past 1."""
    return 1 - value if name == "gae_lambda" else value

@dataclass
class Args:  # --help shows the comment after each field
    env_id: str = "CartPole-v1"  # A gymnasium task, or module:id.
    max_episode_steps: int = None  # Cap on an episode's steps (the task's limit, or 1,000).
    total_timesteps: int = 614_400  # Training steps of all members together.
    num_envs: int = 8  # Envs each member steps side by side.
    num_steps: int = 128  # Steps per env in each rollout.
    pop_size: int = 6  # Members of the population.
    evo_steps: int = 10_240  # A member's steps per generation.
    tournament_size: int = 2  # Members per tournament.
    evolve: bool = True  # Copy and mutate the fittest (--no-evolve: the control, no copies).
    target: float = None  # Fitness to stop at (default: the task's threshold, if any).
    num_minibatches: int = 4  # Minibatches per epoch.
    update_epochs: int = 4  # Passes over each rollout.
    gamma: float = 0.99  # Discount factor.
    norm_adv: bool = True  # Normalize advantages in each minibatch.
    clip_vloss: bool = True  # Clip the value loss too.
    vf_coef: float = 0.5  # Weight of the value loss.
    max_grad_norm: float = 0.5  # Largest norm of the gradient.
    seed: int = 1  # Seed of members, envs, evolution.
    workers: int = None  # Members trained side by side (default: cores), up to pop_size.
    run_dir: str = ""  # The run's folder (default: runs/...).
    save_interval: float = 300.0  # Seconds between checkpoints.
    resume: str = ""  # Continue the run in this folder.
    eval: str = ""  # Play the fittest member this run scored.
    eval_episodes: int = 10  # Episodes of a fitness, and of --eval.
    deterministic: bool = False  # Play the likeliest action (fitness games too).
    gif: str = ""  # With --eval: write the first episode to this GIF.

def make_envs(args, num_envs):  # train_member() says how they reset
    # Drawing only for --gif: it slows some tasks down, and a
    # task of one's own need not take render_mode.
    settings = dict(render_mode="rgb_array") if args.gif else {}
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # no display
    make = partial(gym.make, args.env_id, max_episode_steps=args.max_episode_steps, **settings)
    # [core-1] Several envs step side by side: more data per
    # network call, and less correlated samples.
    envs = gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode="SameStep")
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)  # info: episodes' returns

def layer_init(layer, std=2 ** 0.5):
    # [core-2] Orthogonal weights keep the signal's scale at first;
    # the gain sqrt(2), made for ReLU, is OpenAI's for tanh too.
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.zeros_(layer.bias)
    return layer

def mlp(in_size, out_size, out_std):  # 64x64 tanh
    return nn.Sequential(layer_init(nn.Linear(in_size, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, out_size), std=out_std))

def action_distribution(space, output, logstd):
    """The policy over `space`, from the actor's output (B,
    flatdim(space)): logits, or the means of a Box's actions.
    An action of several parts gets one log-probability and
    one entropy: the sums over its parts."""
    if isinstance(space, Discrete):
        return Categorical(logits=output)
    if isinstance(space, MultiBinary):
        return Independent(Bernoulli(logits=output), 1)
    if isinstance(space, Box):
        # [cont-1, cont-3] A Normal per action dimension,
        # independent of the others given the state.
        return Independent(Normal(output, logstd.exp().expand_as(output)), 1)
    # MultiDiscrete: a Categorical per dimension, the logits
    # padded with -inf (probability 0) to one length.
    sizes = space.nvec.tolist()
    pad = [nn.functional.pad(x, (0, max(sizes) - x.shape[-1]), value=-math.inf)
           for x in output.split(sizes, dim=-1)]
    return Independent(Categorical(logits=torch.stack(pad, dim=-2)), 1)

def to_env(space, action):
    """An action as the env takes it: a numpy array."""
    action = action.cpu().numpy() + getattr(space, "start", 0)  # Discrete(n, start)
    if isinstance(space, Box):
        # [cont-5] Clipped to the bounds only here: the rollout
        # keeps the sample, whose log-probability the update redoes.
        action = action.clip(space.low, space.high)
    return action.astype(space.dtype)

class Agent(nn.Module):
    """An actor and a critic that share no layers [core-13],
    so the value loss cannot pull on the policy's features."""

    def __init__(self, envs, args):
        super().__init__()
        obs_size = envs.single_observation_space.shape[0]
        self.space = envs.single_action_space
        self.critic = mlp(obs_size, 1, out_std=1.0)
        # Small last weights: all actions about as likely.
        self.actor = mlp(obs_size, gym.spaces.flatdim(self.space), out_std=0.01)
        self.actor_logstd = None
        if isinstance(self.space, Box):
            # [cont-2] A log std per action dimension, learned
            # but the same in every state; -0.5 at first.
            self.actor_logstd = nn.Parameter(torch.full(self.space.shape, -0.5))

    @torch.no_grad()  # V for GAE: no gradients
    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x, action=None, greedy=False):
        """x: (B, obs_size); action: (B, ...) to score, or None
        to draw. -> action, log pi(action|x), entropy, V(x)."""
        dist = action_distribution(self.space, self.actor(x), self.actor_logstd)
        if action is None:  # torch's Bernoulli mode is nan at p 0.5: take 0
            action = dist.mode.nan_to_num(0) if greedy else dist.sample()
        value = self.critic(x).squeeze(-1)
        return action, dist.log_prob(action), dist.entropy(), value

# [core-5] Generalized advantage estimation. The k-step estimate
# sums k rewards, then trusts V: r_t + gamma r_t+1 + ... +
# gamma^k V(s_t+k) - V(s_t). GAE averages these with weights
# (1 - lambda) lambda^(k-1), the longest (to the rollout's end)
# taking the rest. At lambda 0 it is the one-step estimate,
# which trusts V (biased, steady); at 1 the rewards' sum to the
# rollout's end, trusting V only there (less biased, noisy).
#   delta_t = r_t + gamma V(s_t+1) (1 - d_t+1) - V(s_t)
#   A_t = delta_t + gamma lambda (1 - d_t+1) A_t+1
#   R_t = A_t + V(s_t), the critic's target
# The trap: d_t = dones[t] = 1 says that observation t starts
# a new episode, so step t-1 ended one: its target drops V(s_t).
# (An episode ends at step 5: dones[6] = 1, delta_5 drops V(s_6).)
# V(s_T) = next_value, d_T = next_done, A_T = 0.
def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    next_values = torch.cat([values[1:], next_value[None]])
    next_nonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    deltas = rewards + gamma * next_values * next_nonterminal - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)  # A_t+1
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gamma * gae_lambda * next_nonterminal[t] * last
        advantages[t] = last
    return advantages, advantages + values

# [core-8, core-9, core-10] The clipped objective as a loss.
# With r_t = pi(a_t|s_t) / pi_old(a_t|s_t), e = clip_coef,
# the paper maximizes mean(min(r_t A, clip(r_t, 1-e, 1+e) A)),
# a pessimistic bound; as min(a, b) = -max(-a, -b), the loss:
#   L_clip = mean(max(-A r_t, -A clip(r_t, 1-e, 1+e)))
# Past 1-e or 1+e in the direction A favours, the clipped
# term wins and its gradient is 0: nothing pushes the policy
# further. Value clipping is not in the paper but in OpenAI's
# code: past e from the rollout's V, in the return's units, the
# loss stops pulling V on. The rewards are not scaled here: where
# V nears 100 (CartPole's discounted return), 0.1-0.3 is small.
#   V_clip = V_old + clip(V - V_old, -e, e)
#   L_V = mean(max((V - R)^2, (V_clip - R)^2)) / 2
#   loss = L_clip - ent_coef H + vf_coef L_V
# with H, the entropy, a bonus that keeps the policy exploring.
def ppo_loss(newlogprob, oldlogprob, advantages, newvalue, oldvalue, returns,
             entropy, clip_coef, vf_coef, ent_coef, clip_vloss=True):
    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    clipped = ratio.clamp(1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(-advantages * ratio, -advantages * clipped).mean()
    v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    if clip_vloss:
        v_clipped = oldvalue + (newvalue - oldvalue).clamp(-clip_coef, clip_coef)
        v_losses = torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2)
        v_loss = 0.5 * v_losses.mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
    # [core-12] Two numbers to watch (README): how far the
    # policy moved, by the estimate of KL(old, new) that Schulman's
    # "Approximating KL Divergence" (2020) calls k3,
    # mean((r - 1) - log r), never below 0 and of low variance;
    # and the share of ratios outside the clip range.
    approx_kl = ((ratio - 1) - logratio).mean()
    clipfrac = ((ratio - 1).abs() > clip_coef).float().mean()
    stats = dict(pg_loss=pg_loss, v_loss=v_loss, entropy=entropy_loss,
                 approx_kl=approx_kl, clipfrac=clipfrac)
    return loss, {name: x.detach() for name, x in stats.items()}

def explained_variance(values, returns):
    """[core-12] 1 - Var(R - V) / Var(R), the share of the
    returns' variance that V explains; nan where R is flat."""
    ratio = (returns - values).var() / returns.var()  # inf or nan if R is flat
    return 1 - ratio.item() if ratio.isfinite() else math.nan

def update(agent, optimizer, args, batch):
    """One update: epochs of minibatch steps. Returns each stat's
    mean over every minibatch (CleanRL: the last one's losses, KL)."""
    batch = {k: x.flatten(0, 1) for k, x in batch.items()}
    stats = []
    for epoch in range(args.update_epochs):
        # [core-6] Each epoch takes the rollout in a new random
        # order, one gradient step per minibatch.
        shuffled = torch.randperm(len(batch["obs"]), device=batch["obs"].device)
        for mb_inds in shuffled.split(len(shuffled) // args.num_minibatches):
            mb = {k: x[mb_inds] for k, x in batch.items()}
            *_, newlogprob, entropy, newvalue = agent.get_action_and_value(mb["obs"], mb["actions"])
            advantages = mb["advantages"]
            if args.norm_adv:
                # [core-7] Advantages get mean 0 and std 1 in each
                # minibatch, as in OpenAI's code: every gradient
                # step has one scale, whatever the rewards' is.
                advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            loss, mb_stats = ppo_loss(
                newlogprob=newlogprob, oldlogprob=mb["logprobs"], advantages=advantages,
                newvalue=newvalue, oldvalue=mb["values"], returns=mb["returns"],
                entropy=entropy, clip_coef=args.clip_coef, vf_coef=args.vf_coef,
                ent_coef=args.ent_coef, clip_vloss=args.clip_vloss)
            optimizer.zero_grad()
            loss.backward()
            # [core-11] The whole gradient is scaled down when its
            # norm is over max_grad_norm: no step is wild.
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            stats.append(torch.stack(list(mb_stats.values())))
    return dict(zip(mb_stats, torch.stack(stats).mean(0).tolist()))

# A member is a dict of plain data, as the checkpoint holds it:
# id (generation x pop_size + place; the elite keeps its id),
# parent's id, mutation, fitness (-inf until scored), hparams,
# and state: its agent's and Adam's state dicts as the bytes
# torch.save writes (None until it trains). Bytes cross to the
# workers holding no file open (a tensor would: one file each).
def build(member, envs, args):
    """The member's agent and Adam, loaded from its state."""
    agent = Agent(envs, args)
    # [core-3] Adam's eps is 1e-5 as in OpenAI's code (torch's: 1e-8).
    optimizer = torch.optim.Adam(agent.parameters(), eps=1e-5)
    # A copy inherits its parent's weights and Adam's moments.
    if member["state"]:  # else the new weights just drawn
        saved = io.BytesIO(member["state"])
        state = torch.load(saved, map_location="cpu", weights_only=True)
        agent.load_state_dict(state["model"])
        optimizer.load_state_dict(state["adam"])
    # Each member's own rate (a load brought back its parent's).
    optimizer.param_groups[0]["lr"] = member["hparams"]["learning_rate"]
    return agent, optimizer

def train_member(member, global_step, args, generation, games, run_start):
    """A member's PPO for a generation, then its fitness, in a
    worker, its random numbers from the run's seed, generation and
    its id, whatever the order or process. global_step: the run's
    before it; games: its fitness games' seeds. -> the member
    trained (a new dict), its CSV rows."""
    # ---- 1. setup
    seeds = np.random.SeedSequence([args.seed, generation, member["id"]])
    seed = int(seeds.generate_state(1)[0])
    torch.manual_seed(seed)
    # One torch thread a member: the workers, side by side, fill the
    # cores (on the CPU: small networks ran slower on a GPU).
    torch.set_num_threads(1)
    # No argument checks in the distributions: weights that diverge
    # mid-update end in the non-finite weights message.
    torch.distributions.Distribution.set_default_validate_args(False)
    envs = make_envs(args, args.num_envs)  # new ones: each generation starts new episodes
    agent, optimizer = build(member, envs, args)
    # The PPO below reads the member's hyperparameters as flags.
    args = argparse.Namespace(**vars(args), **member["hparams"])
    # The run's CSV rows, for the parent to write.
    rows = {"episodes": [], "updates": [], "population": []}
    # The rollout, (num_steps, num_envs, ...) each.
    shape = (args.num_steps, args.num_envs)
    as_float = partial(torch.as_tensor, dtype=torch.float32)
    obs = torch.zeros(shape + envs.single_observation_space.shape)
    actions = torch.zeros(shape + envs.single_action_space.shape)
    logprobs = torch.zeros(shape)
    values = torch.zeros(shape)
    bootstraps = torch.zeros(shape)  # of episodes cut (below)
    rewards = np.zeros(shape, np.float32)
    dones = np.zeros(shape, np.float32)
    next_obs, _ = envs.reset(seed=seed)
    next_done = np.zeros(args.num_envs, bool)
    for rollout in range(math.ceil(args.evo_steps / rewards.size)):  # size: steps a rollout
        # ---- 2. rollout
        started = time.time()  # for the steps a second
        bootstraps.zero_()
        for step in range(args.num_steps):
            obs[step] = as_float(next_obs)
            dones[step] = next_done
            with torch.no_grad():  # the rollout only acts
                acted = agent.get_action_and_value(obs[step])  # a, log pi(a), H, V
            actions[step], logprobs[step], _, values[step] = acted
            action = to_env(envs.single_action_space, actions[step])
            next_obs, reward, term, trunc, info = envs.step(action)
            next_done = term | trunc
            global_step += args.num_envs
            rewards[step] = reward
            rows["episodes"] += ended_episodes(global_step, info, run_start)
            # A time limit is not a death: the episode would have gone on.
            # The env has reset it (its last obs is in info["final_obs"]),
            # and GAE, seeing a done, drops V(next_obs), the new episode's:
            # gamma V(the cut one's last obs) joins that step's reward.
            cut = trunc & ~term
            if cut.any():
                final_obs = as_float(np.stack(info["final_obs"][cut]))
                bootstraps[step, cut] = args.gamma * agent.get_value(final_obs)
        # ---- 3. advantages
        advantages, returns = compute_gae(as_float(rewards) + bootstraps, values, as_float(dones),
                                          agent.get_value(as_float(next_obs)),
                                          as_float(next_done), args.gamma, args.gae_lambda)
        # ---- 4. update
        means = update(agent, optimizer, args, dict(obs=obs, actions=actions, logprobs=logprobs,
                       advantages=advantages, returns=returns, values=values))
        if not all(p.isfinite().all() for p in agent.parameters()):  # a step diverged
            raise FloatingPointError(f"non-finite weights, member {member['id']}")
        # ---- 5. logging
        sps = rewards.size / (time.time() - started)
        rows["updates"].append(dict(
            global_step=global_step, sps=sps, learning_rate=args.learning_rate,
            clip_coef=args.clip_coef, **means,
            explained_variance=explained_variance(values, returns), member=member["id"]))
    envs.close()
    scores, lengths = play(agent, args, games)  # its fitness: their mean
    state = io.BytesIO()
    weights = dict(model=agent.state_dict(), adam=optimizer.state_dict())
    torch.save(weights, state)
    member = dict(member, state=state.getvalue(), fitness=float(scores.mean()))
    rows["population"].append(dict(
        global_step=global_step, eval_steps=int(lengths.sum()), generation=generation,
        member=member["id"], parent=member["parent"], mutation=member["mutation"],
        fitness=member["fitness"], **member["hparams"]))
    return member, rows

@torch.no_grad()  # no learning: play only acts
def play(agent, args, seeds):
    """An episode from each seed -> returns, lengths; --gif."""
    envs = make_envs(args, len(seeds))
    obs, _ = envs.reset(seed=list(seeds))
    totals = np.zeros((2, envs.num_envs))  # returns, lengths
    over = np.zeros(envs.num_envs, bool)
    frames = []  # episode 0's
    while not over.all():  # each has a time limit
        if args.gif and not over[0]:
            frames.append(envs.unwrapped.envs[0].render())
        x = torch.as_tensor(obs, dtype=torch.float32)
        action = agent.get_action_and_value(x, greedy=args.deterministic)[0]
        obs, reward, term, trunc, _ = envs.step(to_env(envs.single_action_space, action))
        totals[0] += reward * ~over  # episodes over score no more
        totals[1] += ~over
        over |= term | trunc
    envs.close()
    if args.gif:  # half the frames, half size: 25 a second
        from PIL import Image
        first, *rest = [Image.fromarray(frame).reduce(2) for frame in frames[::2]]
        first.save(args.gif, "GIF", save_all=True, append_images=rest, duration=40, loop=0)
        print(f"wrote {args.gif}, the first episode")
    return totals

def fittest(members):
    return max(members, key=lambda m: m["fitness"])

def next_generation(population, generation, args):
    """The elite, then mutated copies of tournament winners."""
    rng = np.random.default_rng([args.seed, generation])  # a resume draws the same
    # The fittest, the elite, stays (first in the list) with its id,
    # weights, Adam's state and hyperparameters; population.csv
    # gives "elite" as its mutation.
    members = [dict(fittest(population), mutation="elite")]
    for place in range(1, args.pop_size):
        # A tournament: members drawn at random, with replacement (the
        # elite too); the fittest of those drawn is copied.
        drawn = rng.choice(population, args.tournament_size)
        parent = fittest(drawn)
        child = copy.deepcopy(parent)
        # Its mutation: one hyperparameter x0.8 or x1.2 on its
        # scale (on_scale), then back (1 - x is its own inverse).
        mutation = str(rng.choice(list(HPARAMS)))
        scaled = on_scale(mutation, child["hparams"][mutation]) * rng.choice([0.8, 1.2])
        value = on_scale(mutation, scaled)
        child["hparams"][mutation] = float(np.clip(value, *HPARAMS[mutation]))
        members.append(dict(child, id=generation * args.pop_size + place,
                            parent=parent["id"], mutation=mutation, fitness=-math.inf))
    return members

def train(args):
    # ---- 6. the population
    batch = args.num_envs * args.num_steps
    member_steps = math.ceil(args.evo_steps / batch) * batch
    if member_steps != args.evo_steps:
        print(f"--evo-steps rounded up to whole rollouts: {member_steps:,} steps a member")
    steps = args.pop_size * member_steps  # a generation's
    ckpt = load_checkpoint(args.resume) if args.resume else {}
    rng = np.random.default_rng([args.seed, 0])  # generation 0's draws, log-uniform
    bounds = {k: np.log(sorted(on_scale(k, x) for x in r)) for k, r in HPARAMS.items()}  # logs
    population = ckpt.get("population") or [dict(
        id=i, parent=-1, mutation="new", fitness=-math.inf, state=None,
        hparams={k: on_scale(k, float(np.exp(rng.uniform(*bounds[k])))) for k in HPARAMS})
        for i in range(args.pop_size)]
    global_step = ckpt.get("global_step", 0)  # all members'
    best = ckpt.get("best", population[0])  # -inf until scored
    total = math.ceil(args.total_timesteps / steps) * steps
    target = math.inf if args.target is None else args.target  # none: train it all
    with Run(args, total, ckpt) as run:
        while (global_step < total and not run.stop
               and fittest(population)["fitness"] < target):
            generation = global_step // steps
            # ---- 7. selection and mutation, on the last generation's scores
            if args.evolve and generation:
                population = next_generation(population, generation, args)
            # ---- 8. training and fitness, the members side by side
            first_steps = range(global_step, global_step + steps, member_steps)  # each member's
            # Fitness games: one seed block for all, new each generation (block 0: --eval's).
            first = args.seed + (generation + 1) * args.eval_episodes
            games = range(first, first + args.eval_episodes)
            job = partial(train_member, args=args, generation=generation, games=games,
                          run_start=run.start)
            trained = []
            for member, rows in run.pool.map(job, population, first_steps):
                run.add(rows, member_steps)  # written in the members' order
                trained.append(member)
            population = trained
            global_step += steps
            # For --eval: the fittest member ever scored, kept as it was (an elite
            # may be lucky, or train worse), and every fitness game's seed so far.
            best = fittest([best, *population])
            run.log_generation(dict(population=population, global_step=global_step, best=best,
                                    fitness_seeds=[args.seed + args.eval_episodes, games.stop]))
        if fittest(population)["fitness"] >= target:  # why the bar stops short
            tqdm.write(f"--target {target} reached: stopped after {global_step:,} steps")
            run.stop = 0  # finished: exit 0, no --resume

# ==== Plumbing: flags, bookkeeping, evaluation ====
PLAY = {"eval_episodes", "deterministic", "gif", "seed"}  # set by --eval; others: the checkpoint's
ZERO_OK = ["vf_coef", "seed", "save_interval", "gamma"]

def parse_args(argv=None):
    """Args from the command line or, with --resume or --eval,
    from the checkpoint, all checked before anything is made."""
    # --help: the docstring's first paragraph, then each Args field's comment, read from this file.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     usage=argparse.SUPPRESS)  # a bad flag: one line
    helps = dict(re.findall(r"\n    (\w+): .+?  # (.+)", open(__file__).read()))
    for f in fields(Args):
        kind = dict(action=argparse.BooleanOptionalAction) if f.type is bool else dict(type=f.type)
        default = f" (default: {f.default})" if f.default not in ["", None] else ""
        parser.add_argument("--" + f.name.replace("_", "-"), **kind, default=argparse.SUPPRESS,
                            help=helps[f.name].removesuffix(".") + default + ".")
    given = vars(parser.parse_args(argv))  # the flags typed, by name
    args = Args(**given)
    rules = []  # the checks: (flag, what it must be, whether it is)
    if args.resume or args.eval:
        # A run goes on, or plays, with the arguments it began with.
        saved = load_checkpoint(args.resume or args.eval)["args"]
        own = {"resume", "eval", "workers"} | (PLAY if args.eval else set())
        must = "the checkpoint's, {} (as the run began)"
        rules = [(k, must.format(saved.get(k)), given[k] == saved.get(k)) for k in set(given) - own]
        args = replace(Args(**saved), **{name: getattr(args, name) for name in own})
    if args.resume:  # go on where the checkpoint is now
        folder = args.resume if os.path.isdir(args.resume) else os.path.dirname(args.resume)
        args.run_dir = folder or "."
    name = f"{args.env_id}__{SCRIPT}__{args.seed}__{time.time_ns()}"
    args.run_dir = args.run_dir or f"runs/{name}"
    value = vars(args)  # each flag's, by name
    # Any other number but the target is a size (None: unset).
    sizes = [k for k, x in value.items() if type(x) in [int, float] and k not in ZERO_OK]
    rules += [(k, "in (0, 2**63)", 0 < value[k] < 2**63) for k in sizes if k != "target"]
    rules += [(k, "in [0, 2**63)", 0 <= value[k] < 2**63) for k in ZERO_OK]
    batch = args.num_envs * args.num_steps
    hint = "it holds no run to go on from"
    if os.path.isfile(f"{args.run_dir}/checkpoint.pt"):
        hint = f"to go on: --resume {args.run_dir}"
    rules += [  # a minibatch needs 2 rows: 1 has no spread to normalize by
        ("num_minibatches", f"a divisor of {batch} up to {batch // 2}",
         batch % max(1, args.num_minibatches) == 0 and batch >= 2 * args.num_minibatches),
        ("gamma", "in [0, 1]", 0 <= args.gamma <= 1),
        ("target", "a finite fitness", args.target is None or math.isfinite(args.target)),
        ("resume", "left out with --eval", not (args.resume and args.eval)),
        ("gif", "given with --eval, in a folder that exists",
         not args.gif or (args.eval and os.path.isdir(os.path.dirname(args.gif) or "."))),
        ("run_dir", f"new or empty ({hint})", args.resume or args.eval or is_new(args.run_dir))]
    rules += task_rules(args)  # last: it makes an env
    for name, must, ok in rules:  # the first rule broken ends it
        if not ok:
            parser.error(f"--{name.replace('_', '-')} must be {must} (--help lists every flag)")
    # By default the cores this process may use; one a member at most.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    args.workers = min(args.workers or cores, args.pop_size)
    return args

def is_new(folder):  # an empty folder, or one not made yet (nor under a file)
    if os.path.isdir(folder):
        return not os.listdir(folder)
    return not os.path.exists(folder) and not os.path.isfile(os.path.dirname(folder))

def task_rules(args):
    """Rules for --env-id, checked on an env. A task with no
    time limit gets one, said in a line at the start; --target
    is by default the task's reward threshold."""
    spaces = (Discrete, MultiDiscrete, MultiBinary, Box)
    sys.path.append(os.getcwd())  # module:id, from where the user is
    try:  # an id gymnasium knows, or module:id
        env = gym.make(args.env_id)
    except Exception as e:  # unknown, or an extra missing
        return [("env_id", f"a task gymnasium can make ({e!r})", False)]
    env.close()
    if env.spec.max_episode_steps is None and args.max_episode_steps is None:
        args.max_episode_steps = 1000
        print(f"{args.env_id} has no time limit: --max-episode-steps 1,000")
    if args.target is None:  # the task's own bar, if it has one
        args.target = env.spec.reward_threshold
    obs_space = env.observation_space
    space = env.action_space  # Discrete: a number; the others: vectors
    names = ", ".join(s.__name__ for s in spaces)
    return [("env_id", f"a task with a flat Box observation, not {obs_space}",
             isinstance(obs_space, Box) and len(obs_space.shape) == 1),
            ("env_id", f"a task with {names} actions of one axis, not {space}",
             isinstance(space, spaces) and (isinstance(space, Discrete) or len(space.shape) == 1))]

def load_checkpoint(path):
    """The checkpoint at path or in that folder, or exit 1."""
    path = f"{path}/checkpoint.pt" if os.path.isdir(path) else path
    try:  # plain data: a stranger's file runs no code
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        if [ckpt["script"], ckpt["format"]] != [SCRIPT, FORMAT]:
            raise ValueError(ckpt["script"])
    except Exception as e:  # sys.exit with a text exits 1
        sys.exit(f"error: {path}: no {SCRIPT}.py checkpoint of format {FORMAT} ({e!r:.60})")
    return ckpt

class Run(AbstractContextManager):  # with Run(...) as run
    """The run's bookkeeping: folder, CSV logs, progress bar,
    checkpoints, worker processes. Ctrl-C or SIGTERM asks it to
    stop after the generation; leaving the `with` block saves."""

    def __init__(self, args, total_steps, ckpt):
        self.args = args
        self.dir = args.run_dir
        os.makedirs(self.dir, exist_ok=True)
        self.lock = FileLock(f"{self.dir}/.lock")  # one writer; an OS lock, gone with its process
        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            sys.exit(f"error: {self.dir}: another process is writing this run")
        if total_steps != args.total_timesteps:
            print(f"{total_steps:,} steps: --total-timesteps rounded up to whole generations")
        self.start = time.time() - ckpt.get("wall_time", 0)
        self.due = time.time()  # generation 0 saves
        json.dump(asdict(args), open(f"{self.dir}/args.json", "w"), indent=2)
        self.logs = {}
        for name in ["episodes.csv", "updates.csv", "population.csv"]:
            path = f"{self.dir}/{name}"
            # A resume cuts each CSV back to its whole rows at the checkpoint
            # (later ones go, and one a crash tore). Opened for appending, a
            # file tells its length (and is made if it is gone).
            if ckpt and open(path, "ab").tell() != ckpt["csv_sizes"][name]:
                print(f"{path}: cut to its whole rows at the checkpoint")
                text = open(path, "rb").read(ckpt["csv_sizes"][name])
                os.truncate(path, text.rfind(b"\n") + 1)  # after its last whole row
            self.logs[name] = open(path, "a", buffering=1)  # written line by line
        self.curve = ckpt.get("curve", [])  # each member's (step, fitness)
        self.bar = tqdm(total=total_steps, initial=ckpt.get("global_step", 0), unit="step")
        # The members train side by side in worker processes, each a
        # new interpreter (spawn): a fork would copy this one's threads.
        # They start now, Ctrl-C and SIGTERM ignored (a new interpreter
        # keeps that): a stop as they start is the parent's.
        for s in [signal.SIGINT, signal.SIGTERM]:
            signal.signal(s, signal.SIG_IGN)
        spawn = multiprocessing.get_context("spawn")
        self.others = multiprocessing.active_children()  # the caller's own
        self.pool = ProcessPoolExecutor(args.workers, spawn, initializer=start_worker)
        self.pool.map(int, range(args.workers))  # a job each: all start now
        self.state = {}  # what the checkpoint holds
        self.stop = 0  # the signal that asked to stop
        for s in [signal.SIGINT, signal.SIGTERM]:
            signal.signal(s, self.ask_to_stop)

    def ask_to_stop(self, signum, frame):
        self.stop = signum
        signal.signal(signum, signal.SIG_DFL)  # a second one ends it at once
        tqdm.write("stopping after this generation (again: at once)")

    def add(self, rows, steps):
        """A member's CSV rows, its steps on the bar."""
        for name in rows:
            for row in rows[name]:
                self.write(f"{name}.csv", row)
        self.curve += [(r["global_step"], r["fitness"]) for r in rows["population"]]
        self.bar.n += steps  # even if disabled
        self.bar.set_postfix_str(f"best fitness {self.shown_score()}")

    def log_generation(self, state):
        """state: what a checkpoint holds, after a whole generation."""
        self.state = state
        if time.time() >= self.due:
            self.save()

    def shown_score(self):
        """The score: the fitness of the fittest member scored."""
        if not self.curve:
            return "none, no member has been scored yet"
        return f"{max(fitness for _, fitness in self.curve):.1f}"

    def write(self, name, row):
        """A CSV row (a header first): 6 digits (of a float or
        a 0-d tensor), ints and strings whole."""
        header = ",".join(row) + "\n" if self.logs[name].tell() == 0 else ""
        text = [x if isinstance(x, (int, str)) else f"{x:.6g}" for x in row.values()]
        self.logs[name].write(header + ",".join(map(str, text)) + "\n")

    def save(self, checkpoint=True):
        """The checkpoint (written aside, then renamed), curve.png."""
        if checkpoint and self.state:
            # With the state, what a resume needs: CSVs' lengths, curve.
            sizes = {name: log.tell() for name, log in self.logs.items()}
            ckpt = dict(script=SCRIPT, format=FORMAT, args=asdict(self.args), csv_sizes=sizes,
                        curve=self.curve, wall_time=time.time() - self.start, **self.state)
            torch.save(ckpt, f"{self.dir}/checkpoint.pt.tmp")
            os.replace(f"{self.dir}/checkpoint.pt.tmp", f"{self.dir}/checkpoint.pt")
        self.due = time.time() + self.args.save_interval
        import matplotlib.pyplot as plt
        data = np.array(self.curve, dtype=float).reshape(-1, 2)  # step, fitness
        plt.plot(*data.T, ".", alpha=0.3, label="a member's fitness")
        best = np.maximum.accumulate(data[:, 1])  # the fittest so far
        plt.plot(data[:, 0], best, label=f"best so far: {self.shown_score()}")
        title = f"{SCRIPT}.py, {self.args.env_id}, seed {self.args.seed}"
        plt.gca().set(title=title, xlabel="all members' steps", ylabel="fitness")
        plt.legend()
        plt.savefig(f"{self.dir}/curve.png")
        plt.close()

    def __exit__(self, error, value, _):
        # After an error the last good checkpoint stays; the pool's workers end.
        if error:
            for worker in set(multiprocessing.active_children()) - set(self.others):
                worker.kill()
        self.pool.shutdown(cancel_futures=True)
        self.bar.close()
        self.save(checkpoint=not error)
        self.lock.release()
        if error:
            sys.exit(f"error: {value!r}")
        if self.stop and self.bar.n < self.bar.total:  # exit 130 or 143
            print(f"stopped; continue with --resume {self.dir}")
            sys.exit(128 + self.stop)
        print(f"{self.dir}: best fitness (the luckiest): {self.shown_score()};"
              f" on new games: python {__file__} --eval {self.dir} --eval-episodes 100")

def start_worker():
    """A worker leaves Ctrl-C and SIGTERM to the parent (which
    stops after the generation), and ends with it, even killed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    def end_with_parent():
        multiprocessing.parent_process().join()  # until the parent is gone
        os._exit(1)
    threading.Thread(target=end_with_parent, daemon=True).start()

def ended_episodes(global_step, info, run_start):
    """episodes.csv's rows: the episodes that ended in a step."""
    wall_time = round(time.time() - run_start, 1)
    rows = []
    for i in np.flatnonzero(info.get("_episode", [])):  # ended
        score = float(info["episode"]["r"][i])
        row = {"global_step": global_step, "wall_time": wall_time, "return": score}
        rows.append({**row, "length": info["episode"]["l"][i]})
    return rows

def evaluate(args):
    """--eval: the fittest member, an episode from each of the
    first seeds from --seed on that no fitness game played."""
    torch.set_num_threads(1)  # as in the workers
    torch.manual_seed(args.seed)
    ckpt = load_checkpoint(args.eval)
    played = range(*ckpt["fitness_seeds"])  # one block
    enough = range(args.seed, args.seed + len(played) + args.eval_episodes)
    seeds = [s for s in enough if s not in played]
    envs = make_envs(args, 1)  # for the agent's sizes
    agent = build(ckpt["best"], envs, args)[0]
    envs.close()
    scores = play(agent, args, seeds[:args.eval_episodes])[0]
    spread = f"{scores.mean():.1f} +- {scores.std():.1f}"
    print(f"member {ckpt['best']['id']}, {len(scores)} episodes: {spread}")
    return scores

if __name__ == "__main__":
    args = parse_args()
    run = evaluate if args.eval else train
    run(args)
