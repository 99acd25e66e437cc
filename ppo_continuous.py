"""PPO for continuous control: a Gaussian or tanh-squashed Gaussian policy on MuJoCo, HalfCheetah.

    python ppo_continuous.py                         # HalfCheetah-v5, 1M steps, 7 min on 2 cores
    python ppo_continuous.py --env-id InvertedPendulum-v5 --total-timesteps 61440  # balances, 30 s
    python ppo_continuous.py --eval runs/<run>/checkpoint.pt --gif cheetah.gif

Tags name "The 37 Implementation Details of PPO" (Huang et al., 2022): core-1..13, cont-1..9, aux-3.
The observation and reward statistics are saved with the weights and frozen for --eval (a reloaded
agent scores as in training); a time-limit truncation (every HalfCheetah episode) bootstraps from
V(final observation) instead of counting as a death. CleanRL's settings, but log std -0.5 at first.
Expect at 1M steps a mean of 3400 to 5500 over the last 20 episodes of HalfCheetah-v5 (README.md).
"""
import argparse
import contextlib
import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass, fields
from functools import partial

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

SCRIPT = "ppo_continuous"  # written into every checkpoint, so that a foreign file is recognised
FORMAT = 1  # the checkpoint's layout
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, and what a job scheduler sends


@dataclass
class Args:  # every flag: --help shows the comment after each field
    # experiment
    seed: int = 1  # seed of torch and of the envs
    torch_deterministic: bool = True  # no effect: these MLPs use no cuDNN (kept for old commands)
    device: str = "auto"  # auto (the CPU: faster for these small networks), cpu or cuda
    run_dir: str = ""  # the run's folder (empty: runs/<env>__ppo_continuous__<seed>__<unix time>)
    save_interval: float = 300.0  # seconds between checkpoints (one is also written at the end)
    resume: str = ""  # continue the run of this checkpoint, with the arguments saved in it
    eval: str = ""  # play --eval-episodes episodes with this checkpoint's policy, print the returns
    eval_episodes: int = 10  # episodes played by --eval
    deterministic: bool = False  # --eval takes the most likely action instead of sampling
    gif: str = ""  # --eval also writes the first episode to this GIF file
    # environment
    env_id: str = "HalfCheetah-v5"  # gymnasium env with flat Box observations and Box actions
    total_timesteps: int = 1_000_000  # environment steps of the run
    num_envs: int = 1  # envs stepped in parallel [core-1]
    # algorithm
    num_steps: int = 2048  # steps per env per rollout
    learning_rate: float = 3e-4  # Adam's learning rate at the start
    num_minibatches: int = 32  # minibatches per epoch [core-6]
    update_epochs: int = 10  # passes over each rollout
    clip_coef: float = 0.2  # clip range of the policy ratio and of the value [core-8, core-9]
    ent_coef: float = 0.0  # entropy bonus coefficient [core-10]
    squash: bool = False  # tanh-squash the Gaussian into the action bounds, not clip [cont-5]
    init_logstd: float = -0.5  # the log std at the start: std 0.61 (CleanRL: 0, std 1) [cont-2]
    anneal_lr: bool = True  # anneal the learning rate linearly to 0 [core-4]
    gamma: float = 0.99  # discount factor
    gae_lambda: float = 0.95  # GAE lambda [core-5]
    norm_adv: bool = True  # normalize advantages per minibatch [core-7]
    clip_vloss: bool = True  # clip the value loss [core-9]
    vf_coef: float = 0.5  # value loss coefficient [core-10]
    max_grad_norm: float = 0.5  # global gradient norm clip [core-11]
    target_kl: float = None  # stop an update's epochs once approx_kl exceeds this [aux-3]


def parse_args(argv=None):
    """Args from the command line; with --resume or --eval, the checkpoint's own."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    helps = dict(re.findall(r"\n    (\w+): \w+ = .+?  # (.+)", open(__file__).read()))
    choices = dict(device=["auto", "cpu", "cuda"])
    for f in fields(Args):
        kind = dict(action=argparse.BooleanOptionalAction) if f.type is bool else dict(type=f.type)
        flag = "--" + f.name.replace("_", "-")  # no default: Args fills in what was not typed
        parser.add_argument(flag, **kind, default=argparse.SUPPRESS, choices=choices.get(f.name),
                            help=f"{helps[f.name]} (default: {f.default})")
    given = vars(parser.parse_args(argv))
    args = Args(**given)
    if args.resume or args.eval:  # the checkpoint's arguments, but for what is the caller's
        saved = load_checkpoint(args.resume or args.eval)["args"]
        own = {"resume", "device"}  # with --eval: also how to play
        own |= {"eval", "eval_episodes", "deterministic", "gif", "seed"} if args.eval else set()
        for name in given.keys() - own:
            if given[name] != saved.get(name):
                parser.error(f"--{name.replace('_', '-')} differs from the checkpoint's value")
        args = Args(**{**saved, **{name: given[name] for name in given.keys() & own}})
    sizes = [f.name for f in fields(Args) if f.type is int and f.name != "seed"]
    sizes += ["learning_rate", "clip_coef"]  # and the two floats that must be positive
    for name in [name for name in sizes if getattr(args, name) <= 0]:  # parser.error: exit 2
        parser.error(f"--{name.replace('_', '-')} must be positive")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        parser.error(f"--num-minibatches must divide num_envs * num_steps = {batch_size}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is visible")
    if args.env_id not in gym.registry:
        parser.error(f"--env-id {args.env_id!r}: not a gymnasium env")
    env = gym.make(args.env_id)
    spaces = [env.observation_space, env.action_space]
    if not all(isinstance(s, gym.spaces.Box) and len(s.shape) == 1 for s in spaces):
        parser.error(f"--env-id {args.env_id}: needs flat Box spaces (Discrete: ppo_lstm.py)")
    if args.gif and not args.eval:
        parser.error("--gif goes with --eval")
    folder = args.run_dir or "runs"
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
    if not args.eval and not os.access(folder, os.W_OK):
        parser.error(f"--run-dir {folder}: cannot create or write that folder")
    return args


def make_envs(args, num_envs):
    """Autoreset in the same step: every step stored is real; info["final_obs"] has the last one."""
    settings = dict(render_mode="rgb_array")  # drawn only when --gif calls render()
    if "mujoco" in str(gym.spec(args.env_id).entry_point):
        settings["camera_name"] = "track"  # the model's camera that follows the body, if any
        if sys.platform == "linux":
            os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo draws without a display through EGL
    make = partial(gym.make, args.env_id, **settings)
    return gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode="SameStep")


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)  # [core-2] orthogonal weights, constant bias
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class RunningNorm(nn.Module):  # mean and variance of all batches so far (Chan et al.), in buffers
    def __init__(self, shape=()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape).double())
        self.register_buffer("var", torch.ones(shape).double())
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))  # a tiny batch

    def update(self, x):  # x: (batch, *shape)
        x = torch.as_tensor(x).to(self.mean)  # float64, on the statistics' device
        total = self.count + len(x)
        delta = x.mean(0) - self.mean
        self.mean += delta * len(x) / total
        squares = self.var * self.count + x.var(0, correction=0) * len(x)
        squares += delta ** 2 * self.count * len(x) / total
        self.var.copy_(squares / total)
        self.count.copy_(total)

    def forward(self, x):  # [cont-6, cont-7] normalized, clipped to [-10, 10], float32
        return ((x - self.mean) / (self.var + 1e-8).sqrt()).clamp(-10, 10).float()


def mlp(in_size, out_size, out_std):  # 64x64 tanh; the head picks the last layer's scale [core-2]
    return nn.Sequential(layer_init(nn.Linear(in_size, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, out_size), std=out_std))


class Agent(nn.Module):
    """Separate actor and critic MLPs [cont-4, core-13]. It normalizes raw observations itself."""
    def __init__(self, obs_dim, action_space, init_logstd, squash):
        super().__init__()
        self.obs_norm = RunningNorm(obs_dim)  # [cont-6] the input scale, saved with the weights
        self.return_norm = RunningNorm()  # [cont-8] the reward scale: the critic's output scale
        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, action_space.shape[0], out_std=0.01)  # near 0 at first
        # [cont-2] a state-independent log std, -0.5 (std 0.61) at first: from std 1, two of three
        # HalfCheetah seeds got stuck running on their backs; from 0.61, none of six (README.md).
        self.actor_logstd = nn.Parameter(torch.full(action_space.shape, init_logstd))
        self.squash = squash
        self.register_buffer("low", torch.as_tensor(action_space.low).float())
        self.register_buffer("high", torch.as_tensor(action_space.high).float())

    @torch.no_grad()  # for the rollout only
    def get_value(self, x):
        return self.critic(self.obs_norm(x)).squeeze(-1)

    def get_action_and_value(self, x, u=None, greedy=False):
        """x: (B, obs_dim) raw observations; u: (B, action_dim) the Gaussian sample to score, None
        to draw one. -> the action for the env, u, its log-probability, the entropy and V(x)."""
        x = self.obs_norm(x)
        mean = self.actor_mean(x)
        logstd = self.actor_logstd.expand_as(mean)
        std = logstd.exp()
        if u is None:
            u = mean if greedy else mean + std * torch.randn_like(mean)
        # [cont-1, cont-3] independent Normals, written out: cheaper than torch.distributions here
        logprob = -0.5 * ((u - mean) / std) ** 2 - logstd - 0.5 * math.log(2 * math.pi)
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + logstd
        value = self.critic(x).squeeze(-1)
        if not self.squash:  # [cont-5] the env gets u clipped to its bounds; u itself is stored
            return u.clamp(self.low, self.high), u, logprob.sum(1), entropy.sum(1), value
        # action = center + scale * tanh(u), clipped against rounding. By the change of variables,
        # log p(action) = log N(u) - log |d action/du| = log N(u) - log scale - log(1 - tanh(u)^2),
        # the last term in its stable form 2 (log 2 - u - softplus(-2u)), finite even where tanh(u)
        # rounds to +-1. The rollout stores u: atanh of a saturated action would be infinite.
        scale = (self.high - self.low) / 2
        log_jacobian = scale.log() + 2 * (math.log(2) - u - nn.functional.softplus(-2 * u))
        action = (self.low + scale * (torch.tanh(u) + 1)).clamp(self.low, self.high)
        # The squashed Normal has no closed-form entropy: H = H(Normal) + E[log |d action/du|], with
        # the one sample at hand (exact for the Normal's part, unbiased for the rollout's policy).
        return action, u, (logprob - log_jacobian).sum(1), (entropy + log_jacobian).sum(1), value


def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimation [core-5]; inputs (T, N), but next_value, next_done (N,).
    dones[t] == 1 means observation t is the first of a new episode: step t - 1 ended one. So
    step t goes on in the same episode where dones[t + 1] == 0 (next_done for the last step)."""
    next_values = torch.cat([values[1:], next_value[None]])  # V_{t+1}: (T, N)
    next_nonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])  # 0 where step t ended one
    deltas = rewards + gamma * next_values * next_nonterminal - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)  # A_{t+1}, with A_T = 0
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gamma * gae_lambda * next_nonterminal[t] * last
        advantages[t] = last
    return advantages, advantages + values


def ppo_loss(newlogprob, oldlogprob, advantages, newvalue, oldvalue, returns, entropy,
             clip_coef, vf_coef, ent_coef, clip_vloss=True):
    """The clipped PPO objective as a loss to minimize [core-8..10], its debug values [core-12]."""
    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    clipped_ratio = ratio.clamp(1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio).mean()
    v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    if clip_vloss:  # [core-9] the value moves at most clip_coef away from the rollout's
        v_clipped = oldvalue + (newvalue - oldvalue).clamp(-clip_coef, clip_coef)
        v_losses = torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2)
        v_loss = 0.5 * v_losses.mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
    approx_kl = ((ratio - 1) - logratio).mean()  # Schulman's unbiased, low-variance estimator
    clipfrac = ((ratio - 1).abs() > clip_coef).float().mean()
    stats = dict(pg_loss=pg_loss, v_loss=v_loss, entropy=entropy_loss, approx_kl=approx_kl,
                 clipfrac=clipfrac)
    return loss, {name: value.detach() for name, value in stats.items()}


def minibatch_step(agent, optimizer, args, batch, clip_coef, mb):
    """One gradient step on the rows mb of the flattened rollout; the loss and its stats."""
    b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values = batch
    *_, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
    mb_advantages = b_advantages[mb]
    if args.norm_adv:  # [core-7]
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
    loss, stats = ppo_loss(newlogprob, b_logprobs[mb], mb_advantages, newvalue, b_values[mb],
                           b_returns[mb], entropy, clip_coef, args.vf_coef, args.ent_coef,
                           args.clip_vloss)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)  # [core-11]
    optimizer.step()
    return loss.detach(), stats


def train(args):
    # ---------------------------------------------------------------- 1. setup
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = math.ceil(args.total_timesteps / batch_size)
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.num_envs)
    obs_dim = envs.single_observation_space.shape[0]
    space = envs.single_action_space
    agent = Agent(obs_dim, space, args.init_logstd, args.squash).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)  # [core-3]
    iteration = 0  # updates done
    if args.resume:
        ckpt = load_checkpoint(args.resume)
        agent.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    path, logs = open_run(args, global_step)

    # The rollout: the network's inputs and outputs on the device; rewards and dones on the host.
    shape = (args.num_steps, args.num_envs)
    logprobs = torch.zeros(shape, device=device)
    values = torch.zeros(shape, device=device)
    bootstraps = torch.zeros(shape, device=device)  # gamma * V(final obs) where a step truncated
    rewards = np.zeros(shape, np.float32)
    dones = np.zeros(shape, np.float32)
    on_device = partial(torch.as_tensor, dtype=torch.float32, device=device)
    next_obs, info = envs.reset(seed=args.seed + iteration * args.num_envs)  # new on resume
    next_done = np.zeros(args.num_envs, bool)
    length = np.zeros(args.num_envs, dtype=int)
    recent = []  # the last 100 episodes' returns, for the progress bar
    policy = torch.no_grad()(agent.get_action_and_value)  # the rollout only acts: no gradient
    obs = torch.zeros(shape + (obs_dim,), device=device)  # raw: the Agent normalizes them
    actions = torch.zeros(shape + space.shape, device=device)  # the Gaussian's u
    discounted = np.zeros(shape, np.float32)  # the discounted return at each step [cont-8]
    obs_on_device = on_device  # the observations too go as float32
    score = np.zeros(args.num_envs)  # each episode's return so far
    discounted_return = np.zeros(args.num_envs)  # each episode's discounted return so far

    stop = []  # a signal asks to stop: the update is finished, everything saved, then it stops
    handlers = {s: signal.signal(s, lambda s, _: stop.append(s)) for s in STOP_SIGNALS}
    broken = ""  # why training stopped early, if it did
    bar = tqdm(total=num_iterations * batch_size, initial=global_step, unit="step")
    start = last_save = time.time()  # wall_time in episodes.csv counts from the start
    try:
        while iteration < num_iterations and not stop:
            iteration_start = time.time()
            # Schedules are functions of the iteration: a resumed run picks them up where they were.
            frac = 1.0 - iteration / num_iterations  # 1 in the first update, then down towards 0
            lr = args.learning_rate * (frac if args.anneal_lr else 1.0)  # [core-4]
            optimizer.param_groups[0]["lr"] = lr
            clip_coef = args.clip_coef  # not annealed
            # ------------------------------------------------------------ 2. rollout
            bootstraps.zero_()  # the buffer is reused: no value may stay from a past rollout
            for step in range(args.num_steps):
                obs[step] = obs_on_device(next_obs)
                dones[step] = next_done
                action, actions[step], logprobs[step], _, values[step] = policy(obs[step])
                action_np = action.cpu().numpy()  # the step's one wait for the device
                next_obs, reward, term, trunc, info = envs.step(action_np)
                next_done = term | trunc
                global_step += args.num_envs
                score += reward
                length += 1
                rewards[step] = reward
                discounted[step] = discounted_return = discounted_return * args.gamma + reward
                discounted_return[next_done] = 0
                # Truncation is not termination: gamma * V(final obs) joins the reward GAE sees.
                bootstrap = trunc & ~term  # terminated wins when both are set
                if bootstrap.any():
                    final_obs = obs_on_device(np.stack(info["final_obs"][bootstrap]))
                    bootstraps[step, bootstrap] = args.gamma * agent.get_value(final_obs)
                for i in np.flatnonzero(next_done):
                    wall_time = round(time.time() - start, 1)
                    write_row(logs["episodes.csv"], [global_step, wall_time, score[i], length[i]])
                    recent = recent[-99:] + [score[i]]
                    score[i] = 0
                    length[i] = 0
            # ------------------------------------------------------------ 3. advantages
            # [cont-8, cont-9] rewards / std of the discounted return (not centred), clipped to +-10
            agent.return_norm.update(discounted.reshape(-1))
            reward_scale = (agent.return_norm.var.float() + 1e-8).sqrt()
            gae_rewards = (on_device(rewards) / reward_scale).clamp(-10, 10) + bootstraps
            next_value = agent.get_value(obs_on_device(next_obs))
            advantages, returns = compute_gae(gae_rewards, values, on_device(dones), next_value,
                                              on_device(next_done), args.gamma, args.gae_lambda)
            # ------------------------------------------------------------ 4. update
            flat = [x.flatten(0, 1) for x in (obs, actions, logprobs, advantages, returns, values)]
            update = partial(minibatch_step, agent, optimizer, args, flat, clip_coef)
            all_stats = []  # per minibatch: the loss, ppo_loss's stats; one wait for the device
            for epoch in range(args.update_epochs):
                b_inds = torch.randperm(batch_size, device=device)
                for begin in range(0, batch_size, minibatch_size):
                    loss, stats = update(b_inds[begin:begin + minibatch_size])
                    all_stats.append(torch.stack([loss, *stats.values()]))
                if args.target_kl is not None and stats["approx_kl"] > args.target_kl:  # [aux-3]
                    break
            means = dict(zip(["loss", *stats], torch.stack(all_stats).mean(0).tolist()))
            if not math.isfinite(means["loss"]):
                broken = f"non-finite loss in update {iteration + 1} (global step {global_step})"
                break
            agent.obs_norm.update(obs.flatten(0, 1))  # [cont-6] the statistics move here only
            iteration += 1
            # ------------------------------------------------------------ 5. logging
            sps = batch_size / (time.time() - iteration_start)
            row = dict(global_step=global_step, sps=sps, learning_rate=lr, clip_coef=clip_coef)
            row |= means
            # explained variance: 1 for a perfect critic, 0 a mean (-inf or nan: constant returns)
            unexplained = (returns - values).var() / returns.var()
            row["explained_variance"] = 1 - unexplained.item()
            write_row(logs["updates.csv"], [row[k] for k in HEADERS["updates.csv"].split(",")])
            bar.update(batch_size)
            bar.set_postfix(score=np.mean(recent) if recent else "-", sps=round(sps))
            if time.time() - last_save > args.save_interval:
                save_all(path, logs, args, agent, optimizer, iteration)
                last_save = time.time()
    finally:  # the end, Ctrl-C, SIGTERM and a broken update all save here
        bar.close()
        envs.close()
        save_all(path, logs, args, agent, optimizer, iteration, keep_last=bool(broken))
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if broken:
        sys.exit(f"error: {broken}; {path['checkpoint.pt']} keeps the last good one")
    if stop:
        print(f"stopped; continue with --resume {path['checkpoint.pt']}")
    return args.run_dir


# ======================================================== plumbing: checkpoints, logs, evaluation
def pick_device(name):  # small MLPs run faster on a CPU than on a GPU (README.md)
    # one thread: as fast as 16 for these small networks, and 9x faster than 2 on a busy 2-core box
    torch.set_num_threads(1)
    return torch.device("cpu" if name == "auto" else name)


def load_checkpoint(path):
    """This script's checkpoint at path, or exit 1 with one line saying why not."""
    try:  # weights_only: plain data only, so that a stranger's checkpoint cannot run code
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a message to sys.exit: printed, exit status 1
        sys.exit(f"error: checkpoint {path}: missing, unreadable or truncated ({type(e).__name__})")
    if not isinstance(ckpt, dict) or ckpt.get("script") != SCRIPT or ckpt.get("format") != FORMAT:
        sys.exit(f"error: checkpoint {path}: not a checkpoint of {SCRIPT}.py, format {FORMAT}")
    return ckpt


def save_all(path, logs, args, agent, optimizer, iteration, keep_last=False):
    """Flush the logs, write the checkpoint (keep_last: keep the last good one), draw the curve."""
    for log in logs.values():
        log.flush()
    ckpt = dict(script=SCRIPT, format=FORMAT, model=agent.state_dict(), args=asdict(args),
                optimizer=optimizer.state_dict(), iteration=iteration,
                global_step=iteration * args.num_envs * args.num_steps)
    if not keep_last:  # written whole, then renamed: a crash mid-write spares the last one
        torch.save(ckpt, path["checkpoint.pt"] + ".tmp")
        os.replace(path["checkpoint.pt"] + ".tmp", path["checkpoint.pt"])
    plot_curve(path, f"{SCRIPT}.py, {args.env_id}, seed {args.seed}")


HEADERS = {"episodes.csv": "global_step,wall_time,return,length",
           "updates.csv": "global_step,sps,learning_rate,clip_coef,pg_loss,v_loss,entropy,"
                          "approx_kl,clipfrac,explained_variance"}


def open_run(args, global_step):
    """The run's folder, its files' paths, its CSV logs open (a resume drops rows past it)."""
    args.run_dir = args.run_dir or f"runs/{args.env_id}__{SCRIPT}__{args.seed}__{int(time.time())}"
    os.makedirs(args.run_dir, exist_ok=True)
    with open(os.path.join(args.run_dir, "args.json"), "w") as f:
        json.dump(asdict(args), f, indent=2)
    path = {n: os.path.join(args.run_dir, n) for n in [*HEADERS, "curve.png", "checkpoint.pt"]}
    logs = {}
    for name, header in HEADERS.items():
        resumed = global_step and os.path.exists(path[name])
        rows = open(path[name]).read().split()[1:] if resumed else []
        kept = [row for row in rows if float(row.split(",")[0]) <= global_step]  # old logs: 1e+06
        logs[name] = open(path[name], "w")
        logs[name].write("\n".join([header, *kept]) + "\n")
    return path, logs


def write_row(log, values):
    """One row of a CSV log: numbers to 6 significant digits, whole numbers whole."""
    log.write(",".join(str(x) if isinstance(x, int) else f"{x:.6g}" for x in values) + "\n")


def evaluate(args):
    """Play --eval-episodes episodes, one per env, and print their returns."""
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.eval_episodes)
    obs_dim = envs.single_observation_space.shape[0]
    agent = Agent(obs_dim, envs.single_action_space, args.init_logstd, args.squash).to(device)
    agent.load_state_dict(load_checkpoint(args.eval)["model"])
    obs, _ = envs.reset(seed=args.seed)
    scores = np.zeros(args.eval_episodes)
    over = np.zeros(args.eval_episodes, bool)
    frames = []  # episode 0's frames, for --gif
    while not over.all():  # every episode ends, by itself or at its step limit
        if args.gif and not over[0]:
            frames.append(envs.envs[0].render())  # from the env's own camera
        with torch.no_grad():
            x = torch.from_numpy(obs).to(device)
            action = agent.get_action_and_value(x, greedy=args.deterministic)[0]
        obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
        scores += reward * ~over
        over |= term | trunc
    envs.close()
    if args.gif:
        from PIL import Image
        images = [Image.fromarray(frame).reduce(2) for frame in frames[::2]]  # 25 frames a second
        images[0].save(args.gif, save_all=True, append_images=images[1:], duration=40, loop=0)
    print(f"eval {args.env_id}, {len(scores)} episodes: {scores.mean():.1f} +- {scores.std():.1f}")
    return scores


def plot_curve(path, title):
    """Every episode's return against environment steps, and their moving average."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no window
    import matplotlib.pyplot as plt
    rows = open(path["episodes.csv"]).read().split()[1:]  # global_step, wall_time, return, length
    data = np.array([row.split(",") for row in rows], dtype=float).reshape(-1, 4)
    w = max(1, min(100, len(data) // 5))  # the moving average's window
    cumulative = np.cumsum(np.insert(data[:, 2], 0, 0.0))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(data[:, 0], data[:, 2], ".", alpha=0.25, markersize=3, label="one episode")
    ax.plot(data[w - 1:, 0], (cumulative[w:] - cumulative[:-w]) / w, label=f"mean of {w}")
    ax.set(xlabel="environment steps", ylabel="episodic return", title=title)
    ax.legend()
    fig.savefig(path["curve.png"], dpi=100, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    args = parse_args()
    run = evaluate if args.eval else train
    run(args)
