"""PPO with memory: LSTMs let the policy remember what
one observation does not show, here CartPole with its two
velocities hidden, which no memoryless policy can balance.

    python ppo_lstm.py  # 50k steps, about a minute
    python ppo_lstm.py --no-memory  # the control
    python ppo_lstm.py --env-id Pendulum-v1 --mask 2
    python ppo_lstm.py --eval runs/<run> --gif a.gif

Any task with a flat Box observation and Discrete,
MultiDiscrete, MultiBinary or Box actions; --mask hides
observation indices. Tags such as [core-7] number the details
of "The 37 Implementation Details of PPO" (Huang et al.,
2022), listed in the README. Left out: the KL stop (aux-3),
and one LSTM for actor and critic (worse on masked CartPole).
"""
import argparse
import json
import math
import os
import re
import signal
import sys
import time
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

SCRIPT = "ppo_lstm"  # in every checkpoint
FORMAT = 6  # the checkpoint's layout

@dataclass
class Args:  # --help shows the comment after each field
    env_id: str = "CartPole-v1"  # A gymnasium task, or module:id.
    mask: str = ""  # Indices to hide, as 1,3, or none (default: on CartPole, its velocities).
    max_episode_steps: int = None  # Cap on an episode's steps (the task's limit, or 1,000).
    total_timesteps: int = 50_000  # Environment steps of the run.
    num_envs: int = 8  # Envs stepped side by side.
    num_steps: int = 32  # Steps per env in each rollout.
    learning_rate: float = 1e-3  # Adam's rate at the start.
    num_minibatches: int = 2  # Minibatches of envs per epoch.
    update_epochs: int = 8  # Passes over each rollout.
    clip_coef: float = 0.2  # How far the ratio may leave 1.
    ent_coef: float = 0.0  # Weight of the entropy bonus.
    memory: bool = True  # Give the policy memory (--no-memory: the control, state always 0).
    anneal_lr: bool = True  # Shrink the rate linearly.
    gamma: float = 0.99  # The discount factor.
    gae_lambda: float = 0.95  # GAE's lambda.
    norm_adv: bool = True  # Normalize advantages.
    clip_vloss: bool = True  # Clip the value loss too.
    vf_coef: float = 0.5  # Weight of the value loss.
    max_grad_norm: float = 0.5  # Largest gradient norm.
    seed: int = 1  # Seed of torch and the envs.
    device: str = "auto"  # auto (the CPU: faster for these small networks), cpu or cuda.
    run_dir: str = ""  # The run's folder (default: runs/...).
    save_interval: float = 300.0  # Seconds between saves.
    resume: str = ""  # Continue the run in this folder.
    eval: str = ""  # Play the policy of this run's folder.
    eval_episodes: int = 20  # Episodes --eval plays.
    deterministic: bool = False  # Play the likeliest action.
    gif: str = ""  # With --eval: a GIF of the first episode.

def make_envs(args, num_envs):  # train() says how they reset
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

class RunningNorm(nn.Module):
    """The running mean and variance of all batches given to
    update(), kept in the state dict with the weights."""

    def __init__(self, shape=()):
        super().__init__()
        self.mean = nn.Buffer(torch.zeros(shape).double())
        self.var = nn.Buffer(torch.ones(shape).double())
        self.count = nn.Buffer(torch.tensor(1e-4, dtype=torch.double))  # not 0: no 0/0

    def update(self, x):  # x: (batch, *shape)
        # A batch's mean and variance merged into the totals,
        # with no old data kept (Chan et al.'s parallel form).
        x = torch.as_tensor(x).to(self.mean)  # float64
        total = self.count + len(x)
        delta = x.mean(0) - self.mean
        self.mean += delta * len(x) / total
        squares = self.var * self.count + x.var(0, correction=0) * len(x)
        squares += delta ** 2 * self.count * len(x) / total
        self.var.copy_(squares / total)
        self.count.copy_(total)

    def forward(self, x):
        # [cont-6, cont-7] Observations shifted and scaled to mean 0
        # and std 1, one scale whatever the units; clipped to [-10, 10].
        return ((x - self.mean) / (self.var + 1e-8).sqrt()).clamp(-10, 10).float()

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

class Memory(nn.Module):
    """An LSTM, then a head on its outputs."""

    def __init__(self, out_size, std):
        super().__init__()
        self.lstm = nn.LSTM(64, 64)
        # [lstm-1] The LSTM's weights orthogonal with gain 1,
        # its biases 0.
        for param in self.lstm.parameters():
            init = nn.init.orthogonal_ if param.dim() == 2 else nn.init.zeros_
            init(param)
        self.head = layer_init(nn.Linear(64, out_size), std)

    def forward(self, x, state, done):
        """x: (T, B, 64) from state (h, c); done: (T, B), 1 where
        an episode starts. -> (T * B, out), the state after."""
        # [lstm-3] The state is zeroed where an episode starts, and only
        # there: at a rollout's start it goes on. A stretch of steps begins
        # at step 0 and wherever some env starts an episode; inside one only
        # its first step zeroes a state, so one LSTM call runs the stretch.
        starts = [t for t, new in enumerate(done.any(1).tolist()) if t == 0 or new]
        outputs = []
        for start, end in zip(starts, starts[1:] + [len(x)]):
            keep = (1.0 - done[start]).view(1, -1, 1)  # 0 where an episode starts
            out, state = self.lstm(x[start:end], (state[0] * keep, state[1] * keep))
            outputs.append(out)
        return self.head(torch.cat(outputs).flatten(0, 1)), state

class Agent(nn.Module):
    """An encoder both share, then the actor's and the critic's
    own Memory [core-13]: the value loss trains the encoder, not
    the LSTM the policy reads (one for both failed more seeds)."""

    def __init__(self, envs, args):
        super().__init__()
        obs_size = envs.single_observation_space.shape[0]
        # The mask as parse_args settles it: "" or "none" hides nothing.
        masked = args.mask.split(",")
        self.visible = [i for i in range(obs_size) if str(i) not in masked]
        n = len(self.visible)  # inputs the agent sees
        self.obs_norm = RunningNorm(n)
        self.return_norm = RunningNorm()  # [cont-8] its variance only
        self.encoder = nn.Sequential(layer_init(nn.Linear(n, 64)), nn.Tanh())
        self.space = envs.single_action_space
        # Small last weights: all actions about as likely.
        self.actor = Memory(gym.spaces.flatdim(self.space), 0.01)
        self.critic = Memory(1, 1.0)
        self.memory = args.memory
        self.actor_logstd = None
        if isinstance(self.space, Box):
            # [cont-2] A log std per action dimension, learned
            # but the same in every state; -0.5 at first.
            self.actor_logstd = nn.Parameter(torch.full(self.space.shape, -0.5))

    def scale_rewards(self, rewards, discounted):
        """[cont-8, cont-9] Rewards divided by the std of their
        discounted sums so far, which gives the critic's targets a
        spread of order 1 in any task, then clipped to [-10, 10].
        discounted: those sums at each step, for the statistics.
        Truncation bootstraps, in V's units already, come after."""
        self.return_norm.update(discounted.reshape(-1))
        return (rewards / (self.return_norm.var.float() + 1e-8).sqrt()).clamp(-10, 10)

    @torch.no_grad()  # V for GAE: no gradients
    def get_value(self, x, state):
        """V of x (B, obs_size), one step on from the critic's
        state, as if the episode went on (for a bootstrap, or next_value)."""
        x = self.encoder(self.obs_norm(x[None, :, self.visible]))
        out, _ = self.critic.lstm(x, state)
        return self.critic.head(out[0]).squeeze(-1)

    def get_action_and_value(self, x, states, done, action=None, greedy=False):
        """x: (T, B, obs_size); states: the actor's and the
        critic's (h, c); done: (T, B); action: to score, or None
        to draw. -> action, log pi(action|x), entropy, V; states."""
        x = self.encoder(self.obs_norm(x[..., self.visible]))
        # The control forgets before every step: no memory.
        done = done if self.memory else torch.ones_like(done)
        output, actor_state = self.actor(x, states[0], done)
        value, critic_state = self.critic(x, states[1], done)
        dist = action_distribution(self.space, output, self.actor_logstd)
        if action is None:  # torch's Bernoulli mode is nan at p 0.5: take 0
            action = dist.mode.nan_to_num(0) if greedy else dist.sample()
        if self.memory:  # the control's states stay zero
            states = (actor_state, critic_state)
        value = value.squeeze(-1)  # (T * B,)
        return action, dist.log_prob(action), dist.entropy(), value, states

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
# code: past e from the rollout's V (in the return's units, whose
# spread the scaled rewards keep of order 1), the loss stops pulling V on.
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

def update(agent, optimizer, args, first, batch):
    """One update: epochs of minibatch steps. Returns each stat's
    mean over every minibatch (CleanRL: the last one's losses, KL).
    first: the actor's and critic's states at its start."""
    stats = []
    for epoch in range(args.update_epochs):
        # [core-6, lstm-4] A minibatch is a random share of the envs,
        # each with its whole sequence of steps, in the order the
        # LSTM must see them (by default 2 minibatches of 4 envs).
        shuffled = torch.randperm(args.num_envs, device=batch["obs"].device)
        for mb_inds in shuffled.split(len(shuffled) // args.num_minibatches):
            mb = {k: x[:, mb_inds] for k, x in batch.items()}
            # [lstm-5] Each sequence is replayed from the state the
            # rollout started it with: before the first gradient step
            # the update recomputes the rollout's log-probs; later ones
            # see the memory the new weights build (a zero state would
            # show a memory the policy never had). That first state
            # is held fixed: gradients stop at the rollout's start.
            mb_first = [(h[:, mb_inds], c[:, mb_inds]) for h, c in first]
            # obs keep their time axis for the LSTMs; the actions are
            # flattened to (T * B, ...), as the outputs come.
            _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
                mb["obs"], mb_first, mb["dones"], mb["actions"].flatten(0, 1))
            mb = {k: x.flatten(0, 1) for k, x in mb.items()}
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
            stats.append(mb_stats)
    return {k: torch.stack([s[k] for s in stats]).mean().item() for k in stats[0]}

def train(args):
    # ---- 1. setup
    batch_size = args.num_envs * args.num_steps
    num_iterations = math.ceil(args.total_timesteps / batch_size)
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.num_envs)
    agent = Agent(envs, args).to(device)
    # [core-3] Adam's eps is 1e-5 as in OpenAI's code (torch's: 1e-8).
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    ckpt = load_checkpoint(args.resume) if args.resume else {}
    if ckpt:  # the weights and Adam's state; Run restores the rest
        agent.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    iteration = ckpt.get("iteration", 0)  # updates done
    global_step = iteration * batch_size
    # The rollout, (num_steps, num_envs, ...) each.
    shape = (args.num_steps, args.num_envs)
    on_device = partial(torch.as_tensor, dtype=torch.float32, device=device)
    obs = torch.zeros(shape + envs.single_observation_space.shape, device=device)
    actions = torch.zeros(shape + envs.single_action_space.shape, device=device)
    logprobs = torch.zeros(shape, device=device)
    values = torch.zeros(shape, device=device)
    bootstraps = torch.zeros(shape, device=device)  # of episodes cut (below)
    dones = torch.zeros(shape, device=device)  # the LSTMs read it
    rewards = np.zeros(shape, np.float32)
    discounted = np.zeros(shape, np.float32)  # discounted sums of past rewards
    discounted_return = np.zeros(args.num_envs)
    next_obs, _ = envs.reset(seed=args.seed + iteration * args.num_envs)  # resumed: new seeds
    next_done = np.zeros(args.num_envs, bool)
    # [lstm-2] The states start at zero, and are carried from
    # one rollout to the next: an episode goes on across them.
    zeros = torch.zeros(1, args.num_envs, 64, device=device)  # (layers, B, 64)
    states = [(zeros, zeros), (zeros, zeros)]  # actor's, critic's (h, c)
    with Run(args, num_iterations * batch_size, ckpt) as run:
        while iteration < num_iterations and not run.stop:
            # [core-4] The rate falls linearly with the iteration (a resume
            # goes on), to 1/num_iterations of itself in the last update.
            frac = 1.0 - iteration / num_iterations
            lr = args.learning_rate * (frac if args.anneal_lr else 1.0)
            optimizer.param_groups[0]["lr"] = lr
            # ---- 2. rollout
            first = states  # the update replays from these (never changed in place)
            bootstraps.zero_()
            for step in range(args.num_steps):
                obs[step] = on_device(next_obs)
                dones[step] = on_device(next_done)
                with torch.no_grad():  # [[step]] keeps the time axis: T = 1
                    acted = agent.get_action_and_value(obs[[step]], states, dones[[step]])
                actions[step], logprobs[step], _, values[step], states = acted
                action = to_env(envs.single_action_space, actions[step])
                next_obs, reward, term, trunc, info = envs.step(action)
                next_done = term | trunc
                global_step += args.num_envs
                rewards[step] = reward
                run.episodes(global_step, info)
                discounted_return = discounted_return * args.gamma + reward
                discounted[step] = discounted_return
                discounted_return[next_done] = 0
                # A time limit is not a death: the episode would have gone on.
                # The env has reset it (its last obs is in info["final_obs"]),
                # and GAE, seeing a done, drops V(next_obs), the new episode's:
                # gamma V(the cut one's last obs, with its memory) joins the reward.
                cut = trunc & ~term
                if cut.any():
                    final_obs = on_device(np.stack(info["final_obs"][cut]))
                    critic_state = [s[:, cut] for s in states[1]]
                    bootstraps[step, cut] = args.gamma * agent.get_value(final_obs, critic_state)
            # ---- 3. advantages
            scaled = agent.scale_rewards(on_device(rewards), discounted)
            advantages, returns = compute_gae(scaled + bootstraps, values, dones,
                                              agent.get_value(on_device(next_obs), states[1]),
                                              on_device(next_done), args.gamma, args.gae_lambda)
            # ---- 4. update
            means = update(agent, optimizer, args, first, dict(
                obs=obs, dones=dones, actions=actions, logprobs=logprobs,
                advantages=advantages, returns=returns, values=values))
            if not all(p.isfinite().all() for p in agent.parameters()):  # a step diverged
                sys.exit(f"error: non-finite weights after update {iteration + 1}")
            # The statistics take in the rollout only now: update() normalized as the rollout did.
            agent.obs_norm.update(obs.flatten(0, 1)[:, agent.visible])
            iteration += 1
            # ---- 5. logging
            state = dict(model=agent.state_dict(), optimizer=optimizer.state_dict(),
                         iteration=iteration, global_step=global_step)
            run.log_update(global_step, state, learning_rate=lr, clip_coef=args.clip_coef, **means,
                           explained_variance=explained_variance(values, returns))
    envs.close()

# ==== Plumbing: flags, bookkeeping, evaluation ====
PLAY = {"eval_episodes", "deterministic", "gif", "seed"}  # set by --eval; others: the checkpoint's
ZERO_OK = ["ent_coef", "vf_coef", "seed", "save_interval", "gamma", "gae_lambda"]

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
        own = {"resume", "eval", "device"} | (PLAY if args.eval else set())
        must = "the checkpoint's, {} (as the run began)"
        rules = [(k, must.format(saved.get(k)), given[k] == saved.get(k)) for k in set(given) - own]
        args = replace(Args(**saved), **{name: getattr(args, name) for name in own})
    if args.resume:  # go on where the checkpoint is now
        folder = args.resume if os.path.isdir(args.resume) else os.path.dirname(args.resume)
        args.run_dir = folder or "."
    name = f"{args.env_id}__{SCRIPT}__{args.seed}__{time.time_ns()}"
    args.run_dir = args.run_dir or f"runs/{name}"
    # The default mask belongs to the default task alone.
    if not args.mask:
        cartpole = args.env_id in ["CartPole-v0", "CartPole-v1"]
        args.mask = "1,3" if cartpole else "none"
    value = vars(args)  # each flag's, by name
    # Any other number is a size or a rate (None: a flag unset).
    sizes = [k for k, x in value.items() if type(x) in [int, float] and k not in ZERO_OK]
    rules += [(k, "in (0, 2**63)", 0 < value[k] < 2**63) for k in sizes]
    rules += [(k, "in [0, 1]", 0 <= value[k] <= 1) for k in ["gamma", "gae_lambda"]]
    rules += [(k, "in [0, 2**63)", 0 <= value[k] < 2**63) for k in ZERO_OK]
    batch = args.num_envs * args.num_steps
    minibatches = max(1, args.num_minibatches)  # 0 is refused above
    hint = "it holds no run to go on from"
    if os.path.isfile(f"{args.run_dir}/checkpoint.pt"):
        hint = f"to go on: --resume {args.run_dir}"
    rules += [  # a minibatch (its envs' steps) needs 2 rows: 1 has no spread
        ("num_minibatches", "a divisor of --num-envs leaving 2 rows or more",
         args.num_envs % minibatches == 0 and batch >= 2 * minibatches),
        ("device", "auto, cpu or cuda (a GPU)",
         args.device in ["auto", "cpu"] or (args.device == "cuda" and torch.cuda.is_available())),
        ("resume", "left out with --eval", not (args.resume and args.eval)),
        ("gif", "given with --eval, in a folder that exists",
         not args.gif or (args.eval and os.path.isdir(os.path.dirname(args.gif) or "."))),
        ("run_dir", f"new or empty ({hint})", args.resume or args.eval or is_new(args.run_dir))]
    rules += task_rules(args)  # last: it makes an env
    for name, must, ok in rules:  # the first rule broken ends it
        if not ok:
            parser.error(f"--{name.replace('_', '-')} must be {must} (--help lists every flag)")
    return args

def is_new(folder):  # an empty folder, or one not made yet (nor under a file)
    if os.path.isdir(folder):
        return not os.listdir(folder)
    return not os.path.exists(folder) and not os.path.isfile(os.path.dirname(folder))

def task_rules(args):
    """Rules for --env-id and --mask, checked on an env. A task
    with no time limit gets one, said in a line at the start."""
    sys.path.append(os.getcwd())  # module:id, from where the user is
    try:  # an id gymnasium knows, or module:id
        env = gym.make(args.env_id)
    except Exception as e:  # unknown, or an extra missing
        return [("env_id", f"a task gymnasium can make ({e!r})", False)]
    env.close()
    if env.spec.max_episode_steps is None and args.max_episode_steps is None:
        args.max_episode_steps = 1000
        print(f"{args.env_id} has no time limit: --max-episode-steps 1,000")
    obs_space = env.observation_space
    space = env.action_space  # Discrete: a number; the others: vectors
    spaces = (Discrete, MultiDiscrete, MultiBinary, Box)
    names = ", ".join(s.__name__ for s in spaces)
    flat = isinstance(obs_space, Box) and len(obs_space.shape) == 1
    size = obs_space.shape[0] if flat else 0
    indices = set(map(str, range(size)))  # the observation's, as --mask names them
    return [("env_id", f"a task with a flat Box observation, not {obs_space}", flat),
            ("env_id", f"a task with {names} actions of one axis, not {space}",
             isinstance(space, spaces) and (isinstance(space, Discrete) or len(space.shape) == 1)),
            ("mask", f"none, or some (not all) of the indices 0 to {size - 1}",
             args.mask == "none" or set(args.mask.split(",")) < indices)]

def pick_device(name):
    # One torch thread: these small networks run faster so,
    # and runs side by side do not fight (README.md).
    torch.set_num_threads(1)
    # No argument checks in the distributions: weights that diverge
    # mid-update end in the non-finite weights message.
    torch.distributions.Distribution.set_default_validate_args(False)
    return torch.device("cpu" if name == "auto" else name)

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
    """The run's bookkeeping: its folder, CSV logs, progress
    bar and checkpoints. Ctrl-C or SIGTERM asks it to stop
    after the update; leaving the `with` block saves."""

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
            print(f"{total_steps:,} steps: --total-timesteps rounded up to whole rollouts")
        if ckpt:
            # torch's generator draws on where it stopped. A GPU's is not
            # saved (a run may move device): seeded anew, with seed + steps.
            torch.set_rng_state(ckpt["rng"])
            torch.cuda.manual_seed(args.seed + ckpt["global_step"])
        self.start = time.time() - ckpt.get("wall_time", 0)
        self.last = self.due = time.time()  # update 1 saves
        json.dump(asdict(args), open(f"{self.dir}/args.json", "w"), indent=2)
        self.logs = {}
        for name in ["updates.csv", "episodes.csv"]:
            path = f"{self.dir}/{name}"
            # A resume cuts each CSV back to its whole rows at the checkpoint
            # (later ones go, and one a crash tore). Opened for appending, a
            # file tells its length (and is made if it is gone).
            if ckpt and open(path, "ab").tell() != ckpt["csv_sizes"][name]:
                print(f"{path}: cut to its whole rows at the checkpoint")
                text = open(path, "rb").read(ckpt["csv_sizes"][name])
                os.truncate(path, text.rfind(b"\n") + 1)  # after its last whole row
            self.logs[name] = open(path, "a", buffering=1)  # written line by line
        self.curve = ckpt.get("curve", [])  # each episode's (step, return)
        self.bar = tqdm(total=total_steps, initial=ckpt.get("global_step", 0), unit="step")
        self.state = {}  # what the checkpoint holds
        self.stop = 0  # the signal that asked to stop
        for s in [signal.SIGINT, signal.SIGTERM]:
            signal.signal(s, self.ask_to_stop)

    def ask_to_stop(self, signum, frame):
        self.stop = signum
        signal.signal(signum, signal.SIG_DFL)  # a second one ends it at once
        tqdm.write("stopping after this update, saving first (again: at once)")

    def episodes(self, global_step, info):
        """Logs the episodes that ended in a step, from info."""
        wall_time = round(time.time() - self.start, 1)
        for i in np.flatnonzero(info.get("_episode", [])):  # ended
            score = float(info["episode"]["r"][i])
            row = {"global_step": global_step, "wall_time": wall_time, "return": score}
            self.write("episodes.csv", {**row, "length": info["episode"]["l"][i]})
            self.curve.append((global_step, score))

    def shown_score(self):
        """The score: the mean return of the last 20 episodes."""
        if not self.curve:
            return "none, no episode has ended yet"
        return f"{np.mean([r for _, r in self.curve[-20:]]):.1f}"

    def log_update(self, global_step, state, **row):
        """A row of updates.csv; state: what a checkpoint holds."""
        sps = (global_step - self.bar.n) / (time.time() - self.last)
        self.last = time.time()
        self.write("updates.csv", dict(global_step=global_step, sps=sps, **row))
        self.bar.n = global_step  # even if disabled
        self.bar.set_postfix_str(f"score {self.shown_score()}")
        self.state = state  # what the next save writes
        if time.time() >= self.due:
            self.save()

    def write(self, name, row):
        """A CSV row (a header first): 6 digits (of a float or
        a 0-d tensor), ints and strings whole."""
        header = ",".join(row) + "\n" if self.logs[name].tell() == 0 else ""
        text = [x if isinstance(x, (int, str)) else f"{x:.6g}" for x in row.values()]
        self.logs[name].write(header + ",".join(map(str, text)) + "\n")

    def save(self, checkpoint=True):
        """The checkpoint (written aside, then renamed), curve.png."""
        if checkpoint and self.state:
            # With the state, what a resume needs: CSVs' lengths, the
            # curve so far, torch's random-number generator.
            ckpt = dict(script=SCRIPT, format=FORMAT, args=asdict(self.args), curve=self.curve,
                        csv_sizes={name: log.tell() for name, log in self.logs.items()},
                        rng=torch.get_rng_state(), wall_time=time.time() - self.start, **self.state)
            torch.save(ckpt, f"{self.dir}/checkpoint.pt.tmp")
            os.replace(f"{self.dir}/checkpoint.pt.tmp", f"{self.dir}/checkpoint.pt")
        self.due = time.time() + self.args.save_interval
        import matplotlib.pyplot as plt
        data = np.array(self.curve, dtype=float).reshape(-1, 2)  # step, return
        plt.plot(*data.T, ".", alpha=0.3, label="one episode")
        w = min(20, len(data))  # the score's window
        if w:
            average = np.convolve(data[:, 1], np.ones(w) / w, "valid")
            plt.plot(data[w - 1:, 0], average, label=f"mean of {w}, score {self.shown_score()}")
        title = f"{SCRIPT}.py, {self.args.env_id}, seed {self.args.seed}"
        plt.gca().set(title=title, xlabel="environment steps", ylabel="episodic return")
        plt.legend()
        plt.savefig(f"{self.dir}/curve.png")
        plt.close()

    def __exit__(self, error, *_):
        self.bar.close()
        self.save(checkpoint=not error)  # after an error, the last good one stays
        self.lock.release()
        if not error and self.stop and self.bar.n < self.bar.total:  # exit 130 or 143
            print(f"stopped; continue with --resume {self.dir}")
            sys.exit(128 + self.stop)
        if not error:
            print(f"{self.dir}: the last 20 episodes' score: {self.shown_score()};"
                  f" evaluate: python {__file__} --eval {self.dir}")

@torch.no_grad()
def evaluate(args):
    """--eval: one episode per env, each with its memory."""
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.eval_episodes)
    agent = Agent(envs, args).to(device)
    agent.load_state_dict(load_checkpoint(args.eval)["model"])
    obs, _ = envs.reset(seed=args.seed)
    zeros = torch.zeros(1, envs.num_envs, 64, device=device)
    states = [(zeros, zeros), (zeros, zeros)]  # carried along
    done = zeros[..., 0]  # (1, B): states carry on, into unscored episodes too
    scores = np.zeros(envs.num_envs)
    over = np.zeros(envs.num_envs, bool)
    frames = []  # episode 0's
    while not over.all():  # each has a time limit
        if args.gif and not over[0]:
            frames.append(envs.unwrapped.envs[0].render())
        x = torch.as_tensor(obs[None], dtype=torch.float32, device=device)
        greedy = args.deterministic  # the likeliest action, or a sample
        action, *_, states = agent.get_action_and_value(x, states, done, greedy=greedy)
        action = to_env(envs.single_action_space, action)
        obs, reward, term, trunc, _ = envs.step(action)
        scores += reward * ~over
        over |= term | trunc
    envs.close()
    if args.gif:  # half the frames, half size: 25 a second
        from PIL import Image
        first, *rest = [Image.fromarray(frame).reduce(2) for frame in frames[::2]]
        first.save(args.gif, "GIF", save_all=True, append_images=rest, duration=40, loop=0)
        print(f"wrote {args.gif}, the first episode")
    print(f"{len(scores)} episodes: {scores.mean():.1f} +- {scores.std():.1f}")
    return scores

if __name__ == "__main__":
    args = parse_args()
    run = evaluate if args.eval else train
    run(args)
