"""PPO with evolving hyperparameters: population-based
training (Jaderberg et al., 2017) of PPO agents.

    python ppo_evolve.py  # CartPole, 6 members, 2 minutes
    python ppo_evolve.py --no-evolve  # the control
    python ppo_evolve.py --eval runs/<run> --gif best.gif

Each generation, every member trains with its own learning
rate, entropy bonus, clip range and GAE lambda, then plays
a few episodes; the mean of their returns is the member's
fitness. Then the fittest members are copied (exploit) and
the copies' hyperparameters changed a little (explore), so
that the hyperparameters follow a schedule found while
training. The fittest member keeps its place and trains on;
the other places go to copies of tournament winners, their
weights and Adam's state included, each with one
hyperparameter mutated. The fittest member ever scored is
kept as it was, for --eval. It trains on any gymnasium task
with a flat Box observation, Discrete, MultiDiscrete or
MultiBinary actions and a time limit.

Tags such as [core-7] number the details of "The 37
Implementation Details of PPO" (Huang et al., 2022), listed
in the README. Left out: annealing (core-4) and the KL stop
(aux-3), since evolution sets the rate and the clip range.
"""
import argparse
import copy
import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass, fields
from functools import partial

if __name__ == "__main__":  # Ctrl-C while importing: exit 130, no traceback
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete
from torch.distributions import Bernoulli, Categorical, Independent
from tqdm import tqdm

# No argument checks in the distributions: diverging weights
# end in the non-finite loss message, not a traceback.
torch.distributions.Distribution.set_default_validate_args(False)
SCRIPT = "ppo_evolve"  # in every checkpoint
FORMAT = 5  # the checkpoint's layout
# The evolved hyperparameters and their ranges, around the
# values PPO is known to work with. The first members draw
# them log-uniformly; mutation keeps them inside. The rate's
# floor is 1e-4: lower rates barely learn, yet early on, when
# all members are poor, such a member can win tournaments by
# luck and fill the population, and x1.2 a generation would
# take many generations to bring the rate back up.
HPARAMS = dict(learning_rate=(1e-4, 3e-3), ent_coef=(1e-4, 0.03),
               clip_coef=(0.1, 0.3), gae_lambda=(0.9, 1.0))

@dataclass
class Args:  # --help shows the comment after each field
    env_id: str = "CartPole-v1"  # A gymnasium task, or module:id.
    total_timesteps: int = 600_000  # Training steps of all members together.
    num_envs: int = 8  # Envs each member steps side by side.
    num_steps: int = 128  # Steps per env in each rollout.
    pop_size: int = 6  # Members of the population.
    evo_steps: int = 10_240  # A member's steps per generation.
    tournament_size: int = 2  # Members per tournament.
    evolve: bool = True  # Off, the control: no copies.
    target: float = None  # Fitness to stop at (default: the task's).
    num_minibatches: int = 4  # Minibatches per epoch.
    update_epochs: int = 4  # Passes over each rollout.
    gamma: float = 0.99  # Discount factor.
    norm_adv: bool = True  # Normalize advantages in each minibatch.
    clip_vloss: bool = True  # Clip the value loss too.
    vf_coef: float = 0.5  # Weight of the value loss.
    max_grad_norm: float = 0.5  # Largest norm of the gradient.
    seed: int = 1  # Seed of members, envs, evolution.
    device: str = "auto"  # auto (the CPU), cpu or cuda.
    run_dir: str = ""  # The run's folder (default: runs/...).
    save_interval: float = 300.0  # Seconds between checkpoints.
    resume: str = ""  # Continue the run in this folder.
    eval: str = ""  # Play the fittest member this run scored.
    eval_episodes: int = 10  # Episodes of a fitness, and of --eval.
    deterministic: bool = False  # Play the likeliest action.
    gif: str = ""  # With --eval: write the first episode to this GIF.

def make_envs(args, num_envs):
    """Envs that reset in the step that ends an episode,
    which leaves its last observation in info["final_obs"]."""
    # Frames only for --gif, drawn without a display: a task
    # made to draw can step slower (LunarLander 2.4 times).
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    make = partial(gym.make, args.env_id, render_mode="rgb_array" if args.gif else None)
    # [core-1] Several envs step side by side: more data per
    # network call, and less correlated samples.
    return gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode="SameStep")

def layer_init(layer, std=2 ** 0.5):
    # [core-2] Orthogonal weights keep the signal's scale
    # through the layers at first; biases start at 0.
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.zeros_(layer.bias)
    return layer

def mlp(in_size, out_size, out_std):  # 64x64 tanh
    return nn.Sequential(layer_init(nn.Linear(in_size, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, out_size), std=out_std))

def action_distribution(space, output):
    """The policy over `space`, from the actor's logits (B,
    flatdim(space)). An action of several parts gets one
    log-probability and one entropy: the sums over its parts."""
    if isinstance(space, Discrete):
        return Categorical(logits=output)
    if isinstance(space, MultiBinary):
        return Independent(Bernoulli(logits=output), 1)
    # MultiDiscrete: a Categorical per dimension, the logits
    # padded with -inf (probability 0) to one length.
    sizes = space.nvec.tolist()
    pad = [nn.functional.pad(x, (0, max(sizes) - x.shape[-1]), value=-math.inf)
           for x in output.split(sizes, dim=-1)]
    return Independent(Categorical(logits=torch.stack(pad, dim=-2)), 1)

def to_env(space, action):
    """An action as the env takes it: a numpy array."""
    action = action.cpu().numpy() + getattr(space, "start", 0)  # Discrete(n, start)
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

    @torch.no_grad()  # for the rollout only
    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x, action=None, greedy=False):
        """x: (B, obs_size); action: (B, ...) to score, or None
        to draw. -> action, log pi(action|x), entropy, V(x)."""
        dist = action_distribution(self.space, self.actor(x))
        if action is None:  # torch's Bernoulli mode is nan at p 0.5: take 0
            action = dist.mode.nan_to_num(0) if greedy else dist.sample()
        value = self.critic(x).squeeze(-1)
        return action, dist.log_prob(action), dist.entropy(), value

# [core-5] Generalized advantage estimation: an average of
# the k-step advantage estimates, weighted by lambda^k. At
# lambda 0 it trusts V after one step (biased, steady), at 1
# the rewards alone (unbiased, noisy): bias against variance.
#   delta_t = r_t + gamma V(s_t+1) (1 - d_t+1) - V(s_t)
#   A_t = delta_t + gamma lambda (1 - d_t+1) A_t+1
#   R_t = A_t + V(s_t), the critic's target
# The trap: d_t = dones[t] = 1 says that observation t starts
# a new episode, so step t-1 ended one: its target drops V(s_t).
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
# code: V's change is clipped alike around the rollout's V.
#   V_clip = V_old + clip(V - V_old, -e, e)
#   L_V = mean(max((V - R)^2, (V_clip - R)^2)) / 2
#   loss = L_clip - ent_coef H + vf_coef L_V
# The entropy bonus H keeps the policy exploring.
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
    # policy moved (an estimate of the KL divergence), and
    # the share of ratios outside the clip range.
    approx_kl = ((ratio - 1) - logratio).mean()
    clipfrac = ((ratio - 1).abs() > clip_coef).float().mean()
    stats = dict(pg_loss=pg_loss, v_loss=v_loss, entropy=entropy_loss,
                 approx_kl=approx_kl, clipfrac=clipfrac)
    return loss, {name: x.detach() for name, x in stats.items()}

def update(agent, optimizer, args, batch):
    """Epochs of minibatch steps on a rollout -> mean stats."""
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
            stats.append(torch.stack([loss.detach(), *mb_stats.values()]))
    return dict(zip(["loss", *mb_stats], torch.stack(stats).mean(0).tolist()))

# A member is a dict of plain data, as the checkpoint holds
# it: id (given where it is made: generation x pop_size +
# its place; the elite keeps its id), parent's id, mutation,
# fitness (-inf until scored), its hparams, and the state
# dicts of its agent ("model") and of Adam ("adam"), both
# empty until it first trains.
def build(member, envs, args, device):
    """The member's agent and Adam, from copies of its state."""
    agent = Agent(envs, args).to(device)
    if member["model"]:  # else the new weights just drawn
        agent.load_state_dict(member["model"])
    # [core-3] Adam's eps is 1e-5, as in OpenAI's code.
    optimizer = torch.optim.Adam(agent.parameters(), eps=1e-5)
    # A copy inherits Adam's moment estimates, so it goes on
    # where its parent was. They are deep-copied: Adam changes
    # its state in place, and the parent must stay as it was.
    if member["adam"]:
        optimizer.load_state_dict(copy.deepcopy(member["adam"]))
    # Loading Adam's state brings back the parent's learning
    # rate: the member's own is set after the load.
    optimizer.param_groups[0]["lr"] = member["hparams"]["learning_rate"]
    return agent, optimizer

def train_member(member, args, generation, global_step, run):
    """A member's PPO for a generation, then its fitness. What
    is random comes from the run's seed, the generation and
    the member's id, not from the order members train in.
    -> the member trained, a new dict."""
    # ---- 1. setup
    seeds = np.random.SeedSequence([args.seed, generation, member["id"]])
    seed = int(seeds.generate_state(1)[0])
    torch.manual_seed(seed)
    device = pick_device(args.device)
    envs = make_envs(args, args.num_envs)
    agent, optimizer = build(member, envs, args, device)
    # From here on, args holds this member's hyperparameters too.
    args = argparse.Namespace(**vars(args), **member["hparams"])
    run.new_member()  # its envs start new episodes
    # The rollout, (num_steps, num_envs, ...) each.
    shape = (args.num_steps, args.num_envs)
    on_device = partial(torch.as_tensor, dtype=torch.float32, device=device)
    obs = torch.zeros(shape + envs.single_observation_space.shape, device=device)
    actions = torch.zeros(shape + envs.single_action_space.shape, device=device)
    logprobs = torch.zeros(shape, device=device)
    values = torch.zeros(shape, device=device)
    bootstraps = torch.zeros(shape, device=device)  # gamma V(final)
    rewards = np.zeros(shape, np.float32)
    dones = np.zeros(shape, np.float32)
    next_obs, _ = envs.reset(seed=seed)
    next_done = np.zeros(args.num_envs, bool)
    for rollout in range(math.ceil(args.evo_steps / rewards.size)):
        # ---- 2. rollout
        bootstraps.zero_()
        for step in range(args.num_steps):
            obs[step] = on_device(next_obs)
            dones[step] = next_done
            with torch.no_grad():  # the rollout only acts
                actions[step], logprobs[step], _, values[step] = \
                    agent.get_action_and_value(obs[step])
            action = to_env(envs.single_action_space, actions[step])
            next_obs, reward, term, trunc, info = envs.step(action)
            next_done = term | trunc
            global_step += args.num_envs
            rewards[step] = reward
            run.episodes(global_step, reward, next_done)
            # A time limit is not a death: the episode would
            # have gone on, so the value of its final state
            # joins the reward of the step that cut it.
            cut = trunc & ~term
            if cut.any():
                final_obs = on_device(np.stack(info["final_obs"][cut]))
                bootstraps[step, cut] = args.gamma * agent.get_value(final_obs)
        # ---- 3. advantages
        advantages, returns = compute_gae(on_device(rewards) + bootstraps, values, on_device(dones),
                                          agent.get_value(on_device(next_obs)),
                                          on_device(next_done), args.gamma, args.gae_lambda)
        # ---- 4. update
        means = update(agent, optimizer, args, dict(obs=obs, actions=actions, logprobs=logprobs,
                       advantages=advantages, returns=returns, values=values))
        if not math.isfinite(means.pop("loss")):
            sys.exit(f"error: non-finite loss, member {member['id']}")
        # ---- 5. logging
        run.log_update(global_step, None, learning_rate=args.learning_rate,
                       clip_coef=args.clip_coef, **means,
                       explained_variance=1 - ((returns - values).var() / returns.var()).item(),
                       member=member["id"])
    envs.close()
    # The fitness: all members play the same starts, eval_episodes new seeds
    # each generation, after the first block (--eval's, for a default run).
    scores, lengths = play(agent, args, args.seed + (generation + 1) * args.eval_episodes, device)
    member = dict(member, model=agent.cpu().state_dict(), adam=optimizer.state_dict(),
                  fitness=float(scores.mean()))
    run.write("population.csv", dict(
        global_step=global_step, eval_steps=int(lengths.sum()), generation=generation,
        member=member["id"], parent=member["parent"], mutation=member["mutation"],
        fitness=member["fitness"], **member["hparams"]))
    return member

@torch.no_grad()  # no learning: play only acts
def play(agent, args, seed, device):
    """One episode per env -> returns, lengths; --gif."""
    envs = make_envs(args, args.eval_episodes)
    obs, _ = envs.reset(seed=seed)
    totals = np.zeros((2, envs.num_envs))  # returns, lengths
    over = np.zeros(envs.num_envs, bool)
    frames = []  # episode 0's
    while not over.all():  # each has a time limit
        frames += [envs.envs[0].render()] if args.gif and not over[0] else []
        x = torch.as_tensor(obs, dtype=torch.float32, device=device)
        action = agent.get_action_and_value(x, greedy=args.deterministic)[0]
        obs, reward, term, trunc, _ = envs.step(to_env(envs.single_action_space, action))
        totals += [reward * ~over, ~over]
        over |= term | trunc
    envs.close()
    if args.gif:  # half the frames, half size: 25 a second
        from PIL import Image
        images = [Image.fromarray(frame).reduce(2) for frame in frames[::2]]
        images[0].save(args.gif, save_all=True, append_images=images[1:], duration=40, loop=0)
    return totals

def fittest(members):
    return max(members, key=lambda m: m["fitness"])

def next_generation(population, generation, args):
    """The elite, then mutated copies of tournament winners."""
    # Seeded by the generation, so a resumed run draws the same.
    rng = np.random.default_rng([args.seed, generation])
    # The fittest member, the elite, keeps its place, its
    # weights, Adam's state and hyperparameters, and trains
    # on; population.csv gives "elite" as its mutation.
    members = [dict(fittest(population), mutation="elite")]
    for place in range(1, args.pop_size):
        # A tournament: members of the last generation drawn at
        # random, with replacement (the elite can be drawn too);
        # the fittest of those drawn is copied.
        drawn = rng.choice(population, args.tournament_size)
        parent = fittest(drawn)
        child = copy.deepcopy(parent)
        # Its mutation: one hyperparameter x0.8 or x1.2. GAE's
        # lambda goes through 1 - lambda, the inverse of its
        # horizon, so that it too moves a little: 0.95 becomes
        # 0.94 or 0.96, where x1.2 would jump past 1.
        mutation = str(rng.choice(list(HPARAMS)))
        factor = rng.choice([0.8, 1.2])
        value = child["hparams"][mutation] * factor
        if mutation == "gae_lambda":
            value = 1 - (1 - child["hparams"][mutation]) * factor
        child["hparams"][mutation] = float(np.clip(value, *HPARAMS[mutation]))
        members.append(dict(child, id=generation * args.pop_size + place,
                            parent=parent["id"], mutation=mutation, fitness=-math.inf))
    return members

def train(args):
    # ---- 6. the population
    # A member trains whole rollouts: evo_steps rounded up.
    batch = args.num_envs * args.num_steps
    member_steps = math.ceil(args.evo_steps / batch) * batch
    steps = args.pop_size * member_steps  # a generation's
    with gym.make(args.env_id) as env:  # the task's own bar
        threshold = env.spec.reward_threshold
    target = args.target if args.target is not None else threshold
    target = math.inf if target is None else target
    ckpt = load_checkpoint(args.resume) if args.resume else {}
    rng = np.random.default_rng([args.seed, 0])  # generation 0's draws
    population = ckpt.get("population") or [dict(
        id=i, parent=-1, mutation="new", fitness=-math.inf, model={}, adam={},
        hparams={k: float(np.exp(rng.uniform(*np.log(r)))) for k, r in HPARAMS.items()})
        for i in range(args.pop_size)]
    global_step = ckpt.get("global_step", 0)  # all members'
    best = ckpt.get("best", population[0])  # -inf until scored
    total = math.ceil(args.total_timesteps / steps) * steps
    with Run(args, total, ckpt) as run:
        # Ctrl-C or SIGTERM stops the loop after a whole generation.
        while global_step < total and not run.stop \
                and fittest(population)["fitness"] < target:
            generation = global_step // steps
            # ---- 7. selection and mutation, on the last generation's scores
            if args.evolve and generation:
                population = next_generation(population, generation, args)
            # ---- 8. training and fitness, member by member
            trained = []
            for member in population:
                trained.append(train_member(member, args, generation, global_step, run))
                global_step += member_steps
            population = trained
            # The fittest member ever scored is kept apart, as it
            # was when scored: the elite trains on, and training
            # can make it worse. --eval plays this one.
            best = fittest([best, *population])
            run.best = best
            run.state = dict(population=population, global_step=global_step, best=best)

# ==== Plumbing: flags, bookkeeping, evaluation ====
# Flags --eval may set; the others are the checkpoint's.
PLAY = {"eval_episodes", "deterministic", "gif", "seed"}
POSITIVE = ["max_grad_norm"]

def parse_args(argv=None):
    """Args from the command line or, with --resume or --eval,
    from the checkpoint, all checked before anything is made."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    helps = dict(re.findall(r"\n    (\w+): .+?  # (.+)", open(__file__).read()))
    for f in fields(Args):
        kind = dict(action=argparse.BooleanOptionalAction) if f.type is bool else dict(type=f.type)
        parser.add_argument("--" + f.name.replace("_", "-"), **kind, default=argparse.SUPPRESS,
                            help=f"{helps.get(f.name, '')} ({f.default})")
    given = vars(parser.parse_args(argv))
    args = Args(**given)
    rules = []  # (flag, what it must be, whether it is)
    if args.resume or args.eval:
        saved = load_checkpoint(args.resume or args.eval)["args"]
        own = {"resume", "eval", "device"} | (PLAY if args.eval else set())
        rules = [(k, "the checkpoint's", given[k] == saved.get(k)) for k in given.keys() - own]
        args = Args(**{**saved, **{name: getattr(args, name) for name in own}})
    if args.resume:  # go on where the checkpoint is now
        folder = args.resume if os.path.isdir(args.resume) else os.path.dirname(args.resume)
        args.run_dir = folder or "."
    args.run_dir = args.run_dir or f"runs/{args.env_id}__{SCRIPT}__{args.seed}__{int(time.time())}"
    value = vars(args).get
    sizes = [f.name for f in fields(Args) if f.type is int and f.name != "seed"] + POSITIVE
    rules += [(k, "positive", 0 < value(k) < math.inf) for k in sizes]
    rules += [(k, "0 or more", 0 <= value(k) < math.inf) for k in ["seed", "save_interval"]]
    batch = args.num_envs * args.num_steps
    rules += [
        ("gamma", "within [0, 1]", 0 <= args.gamma <= 1),
        ("num_minibatches", f"a divisor of {batch}", batch % max(1, args.num_minibatches) == 0),
        ("device", "auto, cpu or cuda (a GPU)",
         args.device in ["auto", "cpu"] or args.device == "cuda" and torch.cuda.is_available()),
        ("resume", "left out with --eval", not (args.resume and args.eval)),
        ("gif", "given with --eval, in a folder that exists",
         not args.gif or args.eval and os.path.isdir(os.path.dirname(args.gif) or ".")),
        ("run_dir", f"new or empty (to go on: --resume {args.run_dir})",
         args.resume or args.eval or os.path.isdir(args.run_dir) and not os.listdir(args.run_dir)
         or not os.path.exists(args.run_dir) and not os.path.isfile(os.path.dirname(args.run_dir)))]
    rules += task_rules(args)  # last: it makes an env
    for name, must in [(name, must) for name, must, ok in rules if not ok][:1]:
        parser.error(f"--{name.replace('_', '-')} must be {must}")
    return args

SPACES = (Discrete, MultiDiscrete, MultiBinary)

def task_rules(args):
    """Rules for --env-id, checked on an env of the task."""
    try:  # an id gymnasium knows, or module:id
        envs = make_envs(args, 1)
    except Exception as e:  # unknown, or an extra missing
        return [("env_id", f"a task gymnasium can make ({e!r})", False)]
    obs_space = envs.single_observation_space
    space = envs.single_action_space
    limit = envs.envs[0].spec.max_episode_steps
    envs.close()
    names = ", ".join(s.__name__ for s in SPACES)
    return [("env_id", f"a task with a flat Box observation, not {obs_space}",
             isinstance(obs_space, Box) and len(obs_space.shape) == 1),
            ("env_id", f"a task with {names} actions, not {space}",
             isinstance(space, SPACES) and len(space.shape) <= 1),
            # Without a time limit a fitness game might never end.
            ("env_id", "a task with a time limit (max_episode_steps)", limit is not None)]

def pick_device(name):
    # One torch thread: these small networks run faster so,
    # and runs side by side do not fight (README.md).
    torch.set_num_threads(1)
    return torch.device("cpu" if name == "auto" else name)

def load_checkpoint(path):
    """The checkpoint at path or in that folder, or exit 1."""
    path = f"{path}/checkpoint.pt" if os.path.isdir(path) else path
    try:  # plain data: a stranger's file runs no code
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        if [ckpt["script"], ckpt["format"]] != [SCRIPT, FORMAT]:
            raise ValueError(ckpt["script"])
    except Exception as e:  # sys.exit(text): exit 1
        sys.exit(f"error: {path}: not a {SCRIPT}.py checkpoint, format {FORMAT} ({e!r:.60})")
    return ckpt

class Run:
    """The run's bookkeeping: its folder, CSV logs, progress
    bar and checkpoints. Ctrl-C or SIGTERM asks it to stop
    after the generation; leaving the `with` block saves."""

    def __init__(self, args, total_steps, ckpt):
        self.args = args
        self.dir = args.run_dir
        os.makedirs(self.dir, exist_ok=True)
        done = ckpt.get("global_step", 0)  # steps so far
        self.start = time.time() - ckpt.get("wall_time", 0)
        self.last = self.saved = time.time()
        json.dump(asdict(args), open(f"{self.dir}/args.json", "w"), indent=2)
        self.logs = {}
        # A resume drops the rows written after its checkpoint.
        for name in ["episodes.csv", "updates.csv", "population.csv"]:
            rows = open(f"{self.dir}/{name}").read().split() if ckpt else []
            kept = rows[:1] + [r for r in rows[1:] if int(r.split(",")[0]) <= done]
            self.logs[name] = open(f"{self.dir}/{name}", "w", buffering=1)
            self.logs[name].writelines(row + "\n" for row in kept)
        self.bar = tqdm(total=total_steps, initial=done, unit="step")
        self.best = ckpt.get("best")  # the fittest ever scored
        self.state = {}  # what the checkpoint holds
        self.stop = 0  # the signal that asked to stop
        for s in [signal.SIGINT, signal.SIGTERM]:
            signal.signal(s, self.ask_to_stop)

    def ask_to_stop(self, signum, frame):
        self.stop = signum
        tqdm.write("stopping after this generation; saving first")

    def new_member(self):
        """A member's envs start anew, and so do the episodes."""
        self.score = np.zeros(self.args.num_envs)
        self.length = np.zeros(self.args.num_envs, int)

    def episodes(self, global_step, reward, ended):
        """Adds a step's rewards; logs the episodes ended."""
        self.score += reward
        self.length += 1
        for i in np.flatnonzero(ended):
            row = {"global_step": global_step, "wall_time": round(time.time() - self.start, 1)}
            self.write("episodes.csv", {**row, "return": self.score[i], "length": self.length[i]})
        self.score[ended] = 0
        self.length[ended] = 0

    def log_update(self, global_step, state, **row):
        """A row of updates.csv; state: a checkpoint or None."""
        sps = (global_step - self.bar.n) / (time.time() - self.last)
        self.last = time.time()
        self.write("updates.csv", dict(global_step=global_step, sps=sps, **row))
        self.bar.update(global_step - self.bar.n)
        if self.best:
            self.bar.set_postfix_str(f"fittest {self.best['fitness']:.1f}")
        self.state = state or self.state
        if time.time() - self.saved >= self.args.save_interval:
            self.save()

    def write(self, name, row):
        """A CSV row (a header first): 6 digits, ints whole."""
        if self.logs[name].tell() == 0:
            self.logs[name].write(",".join(row) + "\n")
        text = [x if isinstance(x, (int, str)) else f"{x:.6g}" for x in row.values()]
        self.logs[name].write(",".join(map(str, text)) + "\n")

    def save(self, checkpoint=True):
        """The checkpoint (renamed in place), curve.png."""
        if checkpoint and self.state:
            ckpt = dict(script=SCRIPT, format=FORMAT, args=asdict(self.args),
                        wall_time=time.time() - self.start, **self.state)
            torch.save(ckpt, f"{self.dir}/checkpoint.pt.tmp")
            os.replace(f"{self.dir}/checkpoint.pt.tmp", f"{self.dir}/checkpoint.pt")
        self.saved = time.time()
        import matplotlib.pyplot as plt
        rows = [row.split(",") for row in open(f"{self.dir}/episodes.csv").read().split()[1:]]
        returns = np.array(rows, dtype=float).reshape(-1, 4)[:, [0, 2]]  # step, return
        plt.plot(*returns.T, ".", alpha=0.3, label="one episode")
        w = min(100, len(rows) // 5)  # a moving average's window
        if w > 1:
            average = np.convolve(returns[:, 1], np.ones(w) / w, "valid")
            plt.plot(returns[w - 1:, 0], average, label=f"mean of {w}")
        title = f"{SCRIPT}.py, {self.args.env_id}, seed {self.args.seed}"
        plt.gca().set(title=title, xlabel="environment steps", ylabel="episodic return")
        plt.legend()
        plt.savefig(f"{self.dir}/curve.png")
        plt.close()

    def __enter__(self):
        return self

    def __exit__(self, error, *_):
        # After an error the last good checkpoint stays.
        self.bar.close()
        self.save(checkpoint=error is None)
        if error is None and self.stop:  # exit 130 or 143
            print(f"stopped; continue with --resume {self.dir}")
            sys.exit(128 + self.stop)
        if error is None and self.best:
            score = f"fitness {self.best['fitness']:.1f} ({self.args.eval_episodes} episodes)"
            print(f"{self.dir}: fittest member {self.best['id']}, {score};"
                  f" evaluate: python {SCRIPT}.py --eval {self.dir}")

def evaluate(args):
    """--eval: the fittest member, one episode per env."""
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    best = load_checkpoint(args.eval)["best"]
    envs = make_envs(args, 1)  # for the agent's sizes
    agent = build(best, envs, args, device)[0]
    envs.close()
    scores = play(agent, args, args.seed, device)[0]
    print(f"member {best['id']}, {len(scores)} episodes: {scores.mean():.1f} +- {scores.std():.1f}")
    return scores

if __name__ == "__main__":
    args = parse_args()
    run = evaluate if args.eval else train
    run(args)
