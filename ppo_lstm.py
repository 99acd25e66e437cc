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
from dataclasses import asdict, dataclass, fields
from functools import partial

if __name__ == "__main__":  # Ctrl-C while importing: exit 130, no traceback
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from filelock import FileLock, Timeout
from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete
from torch.distributions import Bernoulli, Categorical, Independent, Normal
from tqdm import tqdm

# No argument checks in the distributions: diverging weights
# end in the non-finite loss message, not a traceback.
torch.distributions.Distribution.set_default_validate_args(False)
SCRIPT = "ppo_lstm"  # in every checkpoint
FORMAT = 4  # the checkpoint's layout

@dataclass
class Args:  # --help shows the comment after each field
    env_id: str = "CartPole-v1"  # A gymnasium task, or module:id.
    mask: str = ""  # Indices to hide, as 1,3, or none (default: on CartPole, its velocities).
    max_episode_steps: int = None  # An episode's steps at most: the task's limit, or 1,000 if none.
    total_timesteps: int = 50_000  # Environment steps of the run.
    num_envs: int = 8  # Envs stepped side by side.
    num_steps: int = 32  # Steps per env in each rollout.
    learning_rate: float = 1e-3  # Adam's rate at the start.
    num_minibatches: int = 1  # Minibatches of envs per epoch.
    update_epochs: int = 8  # Passes over each rollout.
    clip_coef: float = 0.2  # How far the ratio may leave 1.
    ent_coef: float = 0.0  # Weight of the entropy bonus.
    memory: bool = True  # Off, the control: state always 0.
    anneal_lr: bool = True  # Anneal the rate linearly to 0.
    gamma: float = 0.99  # The discount factor.
    gae_lambda: float = 0.95  # GAE's lambda.
    norm_adv: bool = True  # Normalize advantages.
    clip_vloss: bool = True  # Clip the value loss too.
    vf_coef: float = 0.5  # Weight of the value loss.
    max_grad_norm: float = 0.5  # Largest gradient norm.
    seed: int = 1  # Seed of torch and the envs.
    device: str = "auto"  # auto (the CPU), cpu or cuda.
    run_dir: str = ""  # The run's folder (default: runs/...).
    save_interval: float = 300.0  # Seconds between saves.
    resume: str = ""  # Continue the run in this folder.
    eval: str = ""  # Play the policy of this run's folder.
    eval_episodes: int = 20  # Episodes --eval plays.
    deterministic: bool = False  # Play the likeliest action.
    gif: str = ""  # With --eval: a GIF of the first episode.

def make_envs(args, num_envs):
    """Envs that reset in the step that ends an episode,
    which leaves its last observation in info["final_obs"]."""
    # A task is made as gymnasium.make makes it, asked to draw
    # only for --gif: drawing can slow a task (LunarLander 2.4
    # times), and a task of one's own need not take render_mode.
    settings = dict(render_mode="rgb_array") if args.gif else {}
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # no display
    make = partial(gym.make, args.env_id, max_episode_steps=args.max_episode_steps, **settings)
    # [core-1] Several envs step side by side: more data per
    # network call, and less correlated samples.
    return gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode="SameStep")

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
        # [cont-6, cont-7] Observations shifted and scaled to
        # mean 0 and std 1, so that every input has one scale
        # whatever its units, then clipped to [-10, 10].
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
        # [cont-5] Clipped to the bounds only here: the
        # rollout keeps the action as sampled, whose
        # log-probability the update computes again.
        action = action.clip(space.low, space.high)
    return action.astype(space.dtype)

class Memory(nn.Module):
    """An LSTM, then a head on its outputs."""

    def __init__(self, out_size, std):
        super().__init__()
        self.lstm = nn.LSTM(64, 64)
        # [lstm-1] The LSTM's weights orthogonal (std 1) and
        # its biases 0, like the other layers.
        for param in self.lstm.parameters():
            init = nn.init.orthogonal_ if param.dim() == 2 else nn.init.zeros_
            init(param)
        self.head = layer_init(nn.Linear(64, out_size), std)

    def forward(self, x, state, done):
        """x: (T, B, 64) from state (h, c); done: (T, B), 1 where
        an episode starts. -> (T * B, out), the state after."""
        # [lstm-3] The state is zeroed where an episode starts,
        # and only there: at a rollout's start the state goes on.
        # cuts: the steps t > 0 where some env starts an episode;
        # tensor_split cuts the time axis there into stretches,
        # each one LSTM call, faster than a call per step.
        cuts = (done[1:].any(1).nonzero().flatten() + 1).tolist()
        outputs = []
        for stretch, starts in zip(x.tensor_split(cuts), done[[0, *cuts]]):
            keep = (1.0 - starts).view(1, -1, 1)  # 0: forget
            out, state = self.lstm(stretch, (state[0] * keep, state[1] * keep))
            outputs.append(out)
        return self.head(torch.cat(outputs).flatten(0, 1)), state

class Agent(nn.Module):
    """An encoder that both share, then the actor's and the
    critic's own Memory [core-13]. The value loss trains the
    encoder too, but not the LSTM the policy reads: with one
    LSTM for both, more masked CartPole seeds failed."""

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
        spread near 1 in any task, then clipped to [-10, 10].
        discounted: those sums at each step, for the statistics.
        Truncation bootstraps, in V's units already, come after."""
        self.return_norm.update(discounted.reshape(-1))
        return (rewards / (self.return_norm.var.float() + 1e-8).sqrt()).clamp(-10, 10)

    @torch.no_grad()  # for the rollout only
    def get_value(self, x, state):
        """V of x (B, obs_size), one step on from the critic's
        state, as if the episode went on (GAE drops V where it ended)."""
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
        return action, dist.log_prob(action), dist.entropy(), value.squeeze(-1), states

# [core-5] Generalized advantage estimation: the k-step
# advantage estimates averaged with weights (1 - lambda)
# lambda^(k-1), the longest (to the rollout's end) taking the
# weight left over. At lambda 0 it is the one-step estimate,
# which trusts V (biased, steady); at 1 it sums the rewards to
# the rollout's end and trusts V only there (less biased, noisy).
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
    approx_kl = ((ratio - 1) - logratio).mean()  # >= 0, low variance (k3)
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
    """Epochs of minibatch steps on a rollout -> mean stats.
    first: the actor's and critic's states at its start."""
    stats = []
    for epoch in range(args.update_epochs):
        # [core-6, lstm-4] A minibatch is a random share of the
        # envs, each with its whole sequence of steps: the LSTM
        # must see them in order. At the default of one
        # minibatch, it holds every env.
        shuffled = torch.randperm(args.num_envs, device=batch["obs"].device)
        for mb_inds in shuffled.split(len(shuffled) // args.num_minibatches):
            mb = {k: x[:, mb_inds] for k, x in batch.items()}
            # [lstm-5] Each sequence is replayed from the state the
            # rollout started it with, so before the first gradient
            # step the update recomputes the rollout's log-probs (up
            # to float rounding); later ones see the memory the new
            # weights build. A zero state here would show the policy
            # a memory it never had when it acted. That first state
            # was made by the weights of earlier updates and is held
            # fixed: gradients flow back through this rollout's
            # num_steps steps and stop at its start.
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
            stats.append(dict(loss=loss.detach(), **mb_stats))
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
    if ckpt:
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
    bootstraps = torch.zeros(shape, device=device)  # gamma V(final)
    dones = torch.zeros(shape, device=device)  # the LSTMs read it
    rewards = np.zeros(shape, np.float32)
    discounted = np.zeros(shape, np.float32)  # discounted sums of past rewards
    discounted_return = np.zeros(args.num_envs)
    # A resume starts new episodes, with new seeds.
    next_obs, _ = envs.reset(seed=args.seed + iteration * args.num_envs)
    next_done = np.zeros(args.num_envs, bool)
    # [lstm-2] The states start at zero, and are carried from
    # one rollout to the next: an episode goes on across them.
    zeros = torch.zeros(1, args.num_envs, 64, device=device)  # (layers, B, 64)
    states = [(zeros, zeros), (zeros, zeros)]  # actor's, critic's (h, c)
    with Run(args, num_iterations * batch_size, ckpt) as run:
        while iteration < num_iterations and not run.stop:
            # [core-4] The learning rate falls linearly to 0 over
            # the run. It is a function of the iteration alone, so
            # a resumed run goes on where it stopped.
            lr = args.learning_rate * (1.0 - iteration / num_iterations if args.anneal_lr else 1.0)
            optimizer.param_groups[0]["lr"] = lr
            # ---- 2. rollout
            first = states  # the update replays from these
            bootstraps.zero_()
            for step in range(args.num_steps):
                obs[step] = on_device(next_obs)
                dones[step] = on_device(next_done)
                with torch.no_grad():  # [[step]] keeps the time axis: T = 1
                    actions[step], logprobs[step], _, values[step], states = \
                        agent.get_action_and_value(obs[[step]], states, dones[[step]])
                action = to_env(envs.single_action_space, actions[step])
                next_obs, reward, term, trunc, info = envs.step(action)
                next_done = term | trunc
                global_step += args.num_envs
                rewards[step] = reward
                run.episodes(global_step, reward, next_done)
                discounted_return = discounted_return * args.gamma + reward
                discounted[step] = discounted_return
                discounted_return[next_done] = 0
                # A time limit is not a death: the episode would
                # have gone on, so the value of its final state,
                # read with its own memory, joins the last reward.
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
            if not math.isfinite(means.pop("loss")):
                sys.exit(f"error: non-finite loss in update {iteration + 1}")
            # The statistics take in the rollout only now, so that
            # the update saw what the rollout saw.
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
POSITIVE = ["learning_rate", "clip_coef", "max_grad_norm"]

def parse_args(argv=None):
    """Args from the command line or, with --resume or --eval,
    from the checkpoint, all checked before anything is made."""
    # --help: the docstring's first paragraph, each field's comment.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     usage=argparse.SUPPRESS)  # a bad flag: one line
    helps = dict(re.findall(r"\n    (\w+): .+?  # (.+)", open(__file__).read()))
    for f in fields(Args):
        kind = dict(action=argparse.BooleanOptionalAction) if f.type is bool else dict(type=f.type)
        default = f" (default: {f.default})" if f.default not in ["", None] else ""
        parser.add_argument("--" + f.name.replace("_", "-"), **kind, default=argparse.SUPPRESS,
                            help=helps[f.name].removesuffix(".") + default + ".")
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
    # The default mask belongs to the default task alone.
    if not args.mask:
        args.mask = "1,3" if args.env_id in ["CartPole-v0", "CartPole-v1"] else "none"
    sizes = [f.name for f in fields(Args) if f.type is int and f.name != "seed"] + POSITIVE
    rules += [(k, "positive", getattr(args, k) is None or 0 < getattr(args, k) < math.inf)
              for k in sizes]
    rules += [(k, "within [0, 1]", 0 <= getattr(args, k) <= 1) for k in ["gamma", "gae_lambda"]]
    rules += [(k, "0 or more", 0 <= getattr(args, k) < math.inf) for k in ["seed", "save_interval"]]
    rules += [
        ("num_minibatches", "a divisor of --num-envs",
         args.num_envs % max(1, args.num_minibatches) == 0),
        ("device", "auto, cpu or cuda (a GPU)",
         args.device in ["auto", "cpu"] or args.device == "cuda" and torch.cuda.is_available()),
        ("resume", "left out with --eval", not (args.resume and args.eval)),
        ("gif", "given with --eval, in a folder that exists",
         not args.gif or args.eval and os.path.isdir(os.path.dirname(args.gif) or ".")),
        ("run_dir", f"new or empty (to go on: --resume {args.run_dir})",
         args.resume or args.eval or is_new(args.run_dir))]
    rules += task_rules(args)  # last: it makes an env
    broken = [(name, must) for name, must, ok in rules if not ok]
    if broken:  # the first rule broken
        name, must = broken[0]
        parser.error(f"--{name.replace('_', '-')} must be {must} (--help lists every flag)")
    return args

def is_new(folder):
    """An empty folder, or one not made yet (nor under a file)."""
    if os.path.isdir(folder):
        return not os.listdir(folder)
    return not os.path.exists(folder) and not os.path.isfile(os.path.dirname(folder))

SPACES = (Discrete, MultiDiscrete, MultiBinary, Box)

def task_rules(args):
    """Rules for --env-id and --mask, checked on an env. A task
    with no time limit gets one, said in a line at the start."""
    try:  # an id gymnasium knows, or module:id
        env = gym.make(args.env_id)
    except Exception as e:  # unknown, or an extra missing
        return [("env_id", f"a task gymnasium can make ({e!r})", False)]
    env.close()
    if env.spec.max_episode_steps is None and args.max_episode_steps is None:
        args.max_episode_steps = 1000
        print(f"{args.env_id} has no time limit: --max-episode-steps {args.max_episode_steps:,}")
    obs_space = env.observation_space
    flat = isinstance(obs_space, Box) and len(obs_space.shape) == 1
    size = obs_space.shape[0] if flat else 0
    names = ", ".join(s.__name__ for s in SPACES)
    return [("env_id", f"a task with a flat Box observation, not {obs_space}", flat),
            ("env_id", f"a task with {names} actions, not {env.action_space}",
             isinstance(env.action_space, SPACES) and len(env.action_space.shape) <= 1),
            ("mask", f"none or indices 0 to {size - 1}",
             args.mask == "none" or set(args.mask.split(",")) <= set(map(str, range(size))))]

def pick_device(name):
    # One torch thread: these small networks run faster so,
    # and runs side by side do not fight (README.md).
    torch.set_num_threads(1)
    return torch.device("cpu" if name == "auto" else name)

def load_checkpoint(path):
    """The checkpoint at path or in that folder, or exit 1."""
    path = f"{path}/checkpoint.pt" if os.path.isdir(path) else path
    if not os.path.isfile(path):
        sys.exit(f"error: {path}: no such file")
    try:  # plain data: a stranger's file runs no code
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        if [ckpt["script"], ckpt["format"]] != [SCRIPT, FORMAT]:
            raise ValueError(ckpt["script"])
    except Exception as e:  # sys.exit(text): exit 1
        sys.exit(f"error: {path}: not a {SCRIPT}.py checkpoint, format {FORMAT} ({e!r:.60})")
    return ckpt

class Run(AbstractContextManager):  # with Run(...) as run
    """The run's bookkeeping: its folder, CSV logs, progress
    bar and checkpoints. Ctrl-C or SIGTERM asks it to stop
    after the update; leaving the `with` block saves."""

    def __init__(self, args, total_steps, ckpt):
        self.args = args
        self.dir = args.run_dir
        os.makedirs(self.dir, exist_ok=True)
        # One writer per folder: an OS lock that dies with its
        # process (a killed run leaves none). Another process that
        # would write here ends before it touches a file.
        self.lock = FileLock(f"{self.dir}/.lock")
        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            sys.exit(f"error: {self.dir}: another process is writing this run")
        if total_steps != args.total_timesteps:
            print(f"{total_steps:,} steps: --total-timesteps rounded up to whole rollouts")
        steps = ckpt.get("global_step", 0)  # done so far
        self.start = time.time() - ckpt.get("wall_time", 0)
        self.last = self.saved = time.time()
        json.dump(asdict(args), open(f"{self.dir}/args.json", "w"), indent=2)
        self.logs = {}
        # A resume drops the rows written after its checkpoint,
        # and a last row cut short (a power cut, a full disk).
        kept = {}  # each CSV's rows, header first
        for name in ["updates.csv", "episodes.csv"]:
            rows = open(f"{self.dir}/{name}").read().split("\n") if ckpt else []
            if rows and rows[-1]:  # text after the last newline
                print(f"{self.dir}/{name}: dropped a last row cut short")
            kept[name] = rows[:1] + [r for r in rows[1:-1] if int(r.split(",")[0]) <= steps]
            self.logs[name] = open(f"{self.dir}/{name}", "w", buffering=1)
            self.logs[name].writelines(row + "\n" for row in kept[name])
        # Each episode's (step, return) kept: columns 0 and 2.
        rows = [r.split(",") for r in kept["episodes.csv"][1:]]
        self.curve = [(int(r[0]), float(r[2])) for r in rows]
        self.bar = tqdm(total=total_steps, initial=steps, unit="step")
        self.score = np.zeros(args.num_envs)
        self.length = np.zeros(args.num_envs, int)
        self.state = {}  # what the checkpoint holds
        self.stop = 0  # the signal that asked to stop
        for s in [signal.SIGINT, signal.SIGTERM]:
            signal.signal(s, self.ask_to_stop)

    def ask_to_stop(self, signum, frame):
        self.stop = signum
        signal.signal(signum, signal.SIG_DFL)  # a second one ends it at once
        tqdm.write("stopping after this update, saving first (again: at once)")

    def episodes(self, global_step, reward, ended):
        """Adds a step's rewards; logs the episodes ended."""
        self.score += reward
        self.length += 1
        for i in np.flatnonzero(ended):
            row = {"global_step": global_step, "wall_time": round(time.time() - self.start, 1)}
            self.write("episodes.csv", {**row, "return": self.score[i], "length": self.length[i]})
            self.curve.append((global_step, self.score[i]))
        self.score[ended] = 0
        self.length[ended] = 0

    def shown_score(self):
        """The score: the mean return of the last 20 episodes."""
        if not self.curve:
            return "none, no episode has ended yet"
        return f"{np.mean([r for _, r in self.curve[-20:]]):.1f}"

    def log_update(self, global_step, state, **row):
        """A row of updates.csv; state: a checkpoint or None."""
        sps = (global_step - self.bar.n) / (time.time() - self.last)
        self.last = time.time()
        self.write("updates.csv", dict(global_step=global_step, sps=sps, **row))
        self.bar.update(global_step - self.bar.n)
        self.bar.set_postfix_str(f"score {self.shown_score()}")
        self.state = state  # what the next save writes
        if time.time() - self.saved >= self.args.save_interval:
            self.save()

    def write(self, name, row):
        """A CSV row (a header first): 6 digits (of a float or
        a 0-d tensor), ints and strings whole."""
        if self.logs[name].tell() == 0:
            self.logs[name].write(",".join(row) + "\n")
        text = [x if isinstance(x, (int, str)) else f"{x:.6g}" for x in row.values()]
        self.logs[name].write(",".join(map(str, text)) + "\n")

    def save(self, checkpoint=True):
        """The checkpoint (written aside, then renamed), curve.png."""
        if checkpoint and self.state:
            ckpt = dict(script=SCRIPT, format=FORMAT, args=asdict(self.args),
                        wall_time=time.time() - self.start, **self.state)
            torch.save(ckpt, f"{self.dir}/checkpoint.pt.tmp")
            os.replace(f"{self.dir}/checkpoint.pt.tmp", f"{self.dir}/checkpoint.pt")
        self.saved = time.time()
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
        # After an error the last good checkpoint stays.
        self.bar.close()
        self.save(checkpoint=error is None)
        self.lock.release()
        if error is None and self.stop:  # exit 130 or 143
            print(f"stopped; continue with --resume {self.dir}")
            sys.exit(128 + self.stop)
        if error is None:
            print(f"{self.dir}: score {self.shown_score()} (the last 20 episodes);"
                  f" evaluate: python {SCRIPT}.py --eval {self.dir}")

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
            frames.append(envs.envs[0].render())
        x = torch.as_tensor(obs[None], dtype=torch.float32, device=device)
        action, *_, states = agent.get_action_and_value(x, states, done, greedy=args.deterministic)
        obs, reward, term, trunc, _ = envs.step(to_env(envs.single_action_space, action))
        scores += reward * ~over
        over |= term | trunc
    envs.close()
    if args.gif:  # half the frames, half size: 25 a second
        from PIL import Image
        images = [Image.fromarray(frame).reduce(2) for frame in frames[::2]]
        images[0].save(args.gif, save_all=True, append_images=images[1:], duration=40, loop=0)
        print(f"wrote {args.gif}, the first episode")
    print(f"{len(scores)} episodes: {scores.mean():.1f} +- {scores.std():.1f}")
    return scores

if __name__ == "__main__":
    args = parse_args()
    run = evaluate if args.eval else train
    run(args)
