"""PPO for continuous control: a Gaussian or tanh-squashed Gaussian policy on MuJoCo, HalfCheetah by default.

    python ppo_continuous.py                             # HalfCheetah-v5, 1M steps, 7 min on 2 CPU cores
    python ppo_continuous.py --env-id InvertedPendulum-v5 --total-timesteps 61440   # balances within 30 s
    python ppo_continuous.py --squash                    # actions tanh-squashed into their bounds
    python ppo_continuous.py --eval runs/<run>/checkpoint.pt --gif cheetah.gif

Separate actor and critic MLPs (64x64, tanh); the actor outputs the mean of an independent Normal per action
dimension, with a learned log std that does not depend on the state. Implements, tagged by the numbering of
"The 37 Implementation Details of PPO" (Huang et al., 2022): core-1..13, cont-1..9, aux-3. Two things others
get wrong are done right here (FACTS.md): the observation and reward statistics are part of the model, saved
in the checkpoint and frozen for --eval, so a reloaded agent scores what it scored in training; and time-limit
truncation bootstraps from the value of the final observation instead of counting as a death. HalfCheetah
never terminates, so every one of its episodes ends by truncation. The settings are CleanRL's except the
initial log std (-0.5, not 0). Expect, at 1M steps, a mean of 3400 to 5500 over the last 20 episodes on
HalfCheetah-v5 (6 seeds measured, README.md; CleanRL published 1443 on v4, with std 1 and no bootstrap).
"""
import argparse
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, fields

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

SCRIPT, FORMAT = "ppo_continuous", 1  # written into every checkpoint, so that a foreign file is recognised


def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    # experiment
    seed: int = arg(1, "seed of torch and of the envs")
    torch_deterministic: bool = arg(True, "make cuDNN deterministic (same seed, same run)")
    device: str = arg("auto", "auto | cpu | cuda (auto takes CUDA when present)")
    run_dir: str = arg("", "the run's folder (default runs/<env>__ppo_continuous__<seed>__<unix time>)")
    save_interval: float = arg(300.0, "seconds between checkpoints (one is also written at the end)")
    resume: str = arg("", "continue the run of this checkpoint, with its arguments")
    eval: str = arg("", "play --eval-episodes episodes with this checkpoint's policy and print the returns")
    eval_episodes: int = arg(10, "episodes played by --eval")
    deterministic: bool = arg(False, "--eval takes the mean action instead of sampling")
    gif: str = arg("", "--eval also writes the first episode to this GIF file")
    # environment
    env_id: str = arg("HalfCheetah-v5", "gymnasium env id with Box actions")
    total_timesteps: int = arg(1_000_000, "environment steps of the run")
    num_envs: int = arg(1, "envs stepped in parallel [core-1]")
    # algorithm
    squash: bool = arg(False, "tanh-squash the Gaussian into the action bounds instead of clipping [cont-5]")
    init_logstd: float = arg(-0.5, "the policy's log std at the start: std 0.61 (CleanRL: 0, std 1) [cont-2]")
    num_steps: int = arg(2048, "steps per env per rollout")
    learning_rate: float = arg(3e-4, "Adam learning rate")
    anneal_lr: bool = arg(True, "anneal the learning rate linearly to 0 [core-4]")
    gamma: float = arg(0.99, "discount factor")
    gae_lambda: float = arg(0.95, "GAE lambda [core-5]")
    num_minibatches: int = arg(32, "minibatches per epoch [core-6]")
    update_epochs: int = arg(10, "passes over each rollout")
    norm_adv: bool = arg(True, "normalize advantages per minibatch [core-7]")
    clip_coef: float = arg(0.2, "clip range of the policy ratio and of the value [core-8, core-9]")
    clip_vloss: bool = arg(True, "clip the value loss [core-9]")
    ent_coef: float = arg(0.0, "entropy bonus coefficient [core-10]")
    vf_coef: float = arg(0.5, "value loss coefficient [core-10]")
    max_grad_norm: float = arg(0.5, "global gradient norm clip [core-11]")
    target_kl: float = arg(None, "stop an update's epochs once approx_kl exceeds this [aux-3]; None: off")


def parse_args(argv=None):
    """Args from the command line; under --resume or --eval, the checkpoint's own arguments."""
    def parser(suppress):  # suppress: a parser that returns only the flags actually written
        p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        for f in fields(Args):
            kind = dict(action=argparse.BooleanOptionalAction) if f.type is bool else dict(
                type=f.type if f.type in (int, str) else float)
            default = argparse.SUPPRESS if suppress else f.default
            p.add_argument("--" + f.name.replace("_", "-"), default=default, help=f.metadata["help"], **kind)
        return p
    p = parser(False)
    args, given = Args(**vars(p.parse_args(argv))), vars(parser(True).parse_args(argv))
    if args.resume and args.eval:
        p.error("--resume and --eval: give one of them")
    if args.resume or args.eval:
        saved = load_checkpoint(args.resume or args.eval)["args"]
        own = {"resume", "device"}  # flags that may differ from the checkpoint's
        own |= {"eval", "eval_episodes", "deterministic", "gif", "seed"} if args.eval else set()
        for k, v in given.items():
            if k not in own and v != saved[k]:
                p.error(f"--{k.replace('_', '-')} {v} differs from the checkpoint's {saved[k]}; leave it out")
        args = Args(**{**saved, **{k: v for k, v in given.items() if k in own}})
    if args.env_id not in gym.registry:
        p.error(f"--env-id {args.env_id!r} is not a gymnasium env; gymnasium.pprint_registry() lists them")
    env = gym.make(args.env_id)
    flat_obs = isinstance(env.observation_space, gym.spaces.Box) and len(env.observation_space.shape) == 1
    env.close()
    positive = ["total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs",
                "learning_rate", "clip_coef", "eval_episodes"]
    checks = [(getattr(args, k) > 0, f"--{k.replace('_', '-')} must be positive") for k in positive] + [
        ((args.num_envs * args.num_steps) % max(args.num_minibatches, 1) == 0,
         "--num-minibatches must divide --num-envs x --num-steps"),
        (0 <= args.gamma <= 1 and 0 <= args.gae_lambda <= 1, "--gamma and --gae-lambda must lie in [0, 1]"),
        (args.device in ("auto", "cpu", "cuda"), "--device must be auto, cpu or cuda"),
        (args.device != "cuda" or torch.cuda.is_available(), "--device cuda: no CUDA GPU is visible"),
        (not isinstance(env.action_space, gym.spaces.Discrete), f"--env-id {args.env_id} has Discrete "
         "actions: use ppo_lstm.py --mask none or ppo_evolve.py (ppo_atari.py for Atari games)"),
        (isinstance(env.action_space, gym.spaces.Box) and flat_obs,
         f"--env-id {args.env_id}: needs flat Box observations and Box actions"),
        (not args.squash or np.isfinite(np.r_[env.action_space.low, env.action_space.high]).all(),
         f"--squash: the action bounds of {args.env_id} must be finite")]
    for ok, message in checks:
        if not ok:
            p.error(message)
    return args


def make_envs(args, num_envs, render=False):
    """SAME_STEP autoreset: every stored transition is real, the final observation is in info (SPEC.md)."""
    limit = gym.spec(args.env_id).max_episode_steps or 1000  # every episode ends, in training and in --eval
    kwargs = dict(render_mode="rgb_array") if render else {}
    if render and "mujoco" in str(gym.spec(args.env_id).entry_point):
        if sys.platform == "linux":
            os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo draws without a display through EGL
        kwargs["camera_name"] = "track"  # the model's camera that follows the body, where there is one
    make = lambda: gym.make(args.env_id, max_episode_steps=limit, **kwargs)
    return gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)  # [core-2] orthogonal weights, constant bias
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class RunningNorm(nn.Module):
    """Mean and variance of all the batches seen so far (Chan et al.'s parallel update), kept in buffers: they
    are saved and loaded with the weights of the module that holds them."""

    def __init__(self, shape=()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))  # a first, tiny batch

    def update(self, x):  # x: (batch, *shape)
        x = torch.as_tensor(x, dtype=torch.float64, device=self.mean.device)
        n, delta, old = len(x), x.mean(0) - self.mean, self.count.clone()
        self.count += n
        self.mean += delta * n / self.count
        squares = self.var * old + x.var(0, correction=0) * n + delta ** 2 * old * n / self.count
        self.var.copy_(squares / self.count)

    def forward(self, x):  # [cont-6, cont-7]
        return ((x - self.mean) / (self.var + 1e-8).sqrt()).clamp(-10, 10).float()


def mlp(in_size, out_size, out_std):  # 64x64 tanh, the last layer's scale chosen by the head [core-2]
    return nn.Sequential(layer_init(nn.Linear(in_size, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)),
                         nn.Tanh(), layer_init(nn.Linear(64, out_size), std=out_std))


class Agent(nn.Module):
    """Separate actor and critic MLPs [cont-4, core-13], and the running statistics the policy depends on."""

    def __init__(self, obs_dim, args, action_space):
        super().__init__()
        self.obs_norm = RunningNorm(obs_dim)  # [cont-6] the policy's input scale, saved with its weights
        self.return_norm = RunningNorm()  # [cont-8] the reward scale, that is the critic's output scale
        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, action_space.shape[0], out_std=0.01)  # small: near-zero mean at first
        # [cont-2] a log std that does not depend on the state. It starts at -0.5 (std 0.61): from std 1, two
        # HalfCheetah seeds of three got stuck running on their backs, from 0.61 none of six (README.md).
        self.actor_logstd = nn.Parameter(torch.full(action_space.shape, args.init_logstd))
        self.squash = args.squash
        low, high = (torch.as_tensor(b, dtype=torch.float32) for b in (action_space.low, action_space.high))
        self.register_buffer("low", low)
        self.register_buffer("high", high)

    def get_value(self, x):  # x: normalized observations (batch, obs_dim)
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x, u=None, greedy=False):
        """x: normalized observations (batch, obs_dim); u: the Gaussian sample (batch, action_dim) to score,
        None to draw one. -> action for the env, u, log-probability, entropy, value."""
        mean, logstd = self.actor_mean(x), self.actor_logstd.expand(x.shape[0], -1)
        std = logstd.exp()
        if u is None:
            u = mean if greedy else mean + std * torch.randn_like(mean)
        # [cont-1, cont-3] independent Normals, written out: torch.distributions costs more than the MLP here
        logprob = -0.5 * ((u - mean) / std) ** 2 - logstd - 0.5 * math.log(2 * math.pi)
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + logstd
        if not self.squash:  # [cont-5] u goes out as it is, the env call clips it to the bounds
            return u, u, logprob.sum(1), entropy.sum(1), self.get_value(x)
        # action = center + scale * tanh(u). Change of variables: log p(action) = log N(u) - log |d action/du|
        # log |d action / du| = log scale + log(1 - tanh(u)^2), and log(1 - tanh(u)^2) written in its stable
        # form 2 (log 2 - u - softplus(-2u)), finite even where tanh(u) rounds to +-1. u is what the rollout
        # stores: atanh of a saturated action would be infinite.
        scale = (self.high - self.low) / 2
        log_jacobian = scale.log() + 2 * (math.log(2) - u - F.softplus(-2 * u))
        action = self.low + scale * (torch.tanh(u) + 1)
        # The squashed Normal has no closed-form entropy. H = H(Normal) + E[log |d action/du|], estimated with
        # the one sample at hand: exact for the Normal's part, unbiased for the rollout's policy.
        return action, u, (logprob - log_jacobian).sum(1), (entropy + log_jacobian).sum(1), self.get_value(x)


def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimation [core-5]. dones[t] == 1: observation t starts a new episode."""
    next_values = torch.cat([values[1:], next_value[None]])             # V_{t+1}: (T, N)
    next_nonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])  # 0 where step t ended an episode
    deltas = rewards + gamma * next_values * next_nonterminal - values
    advantages, last = torch.zeros_like(rewards), torch.zeros_like(next_value)  # last: A_{t+1}, A_T = 0
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gamma * gae_lambda * next_nonterminal[t] * last
        advantages[t] = last
    return advantages, advantages + values


def ppo_loss(newlogprob, oldlogprob, advantages, newvalue, oldvalue, returns, entropy,
             clip_coef, vf_coef, ent_coef, clip_vloss=True):
    """The clipped PPO objective as a loss to minimize [core-8..10], and its debug variables [core-12]."""
    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    if clip_vloss:  # [core-9] the value may move at most clip_coef away from the rollout's value
        v_clipped = oldvalue + (newvalue - oldvalue).clamp(-clip_coef, clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
    stats = dict(pg_loss=pg_loss, v_loss=v_loss, entropy=entropy_loss,
                 approx_kl=((ratio - 1) - logratio).mean(),  # Schulman's unbiased, low-variance estimator
                 clipfrac=((ratio - 1).abs() > clip_coef).float().mean())
    return loss, {k: v.detach() for k, v in stats.items()}


def load_checkpoint(path):
    """This script's checkpoint at path, or exit 1 with one line saying why not."""
    try:  # weights_only: plain data only, so that a stranger's checkpoint cannot run code
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        sys.exit(f"error: checkpoint {path}: no such file")  # exit status 1
    except Exception as e:
        sys.exit(f"error: checkpoint {path}: unreadable, truncated or not a checkpoint ({type(e).__name__})")
    if not isinstance(ckpt, dict) or ckpt.get("script") != SCRIPT or ckpt.get("format") != FORMAT:
        sys.exit(f"error: checkpoint {path}: not a checkpoint of {SCRIPT}.py, format {FORMAT}")
    return ckpt


def save_checkpoint(path, **state):
    torch.save(dict(script=SCRIPT, format=FORMAT, **state), f"{path}.tmp")
    os.replace(f"{path}.tmp", path)  # atomic: a crash mid-write leaves the previous checkpoint whole


def plot_curve(csv_path, png_path, title, ylabel="episodic return"):
    import matplotlib
    matplotlib.use("Agg")  # files only, no window
    import matplotlib.pyplot as plt
    rows = open(csv_path).read().split()[1:]  # global_step, wall_time, return, length
    data = np.array([[float(x) for x in row.split(",")] for row in rows]).reshape(-1, 4)
    w = max(1, min(100, len(data) // 5))  # the moving average's window
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(data[:, 0], data[:, 2], ".", alpha=0.25, markersize=3, label="one episode")
    cumulative = np.cumsum(np.insert(data[:, 2], 0, 0.0))
    ax.plot(data[w - 1:, 0], (cumulative[w:] - cumulative[:-w]) / w, label=f"mean of {w} episodes")
    ax.set(xlabel="environment steps", ylabel=ylabel, title=title)
    ax.legend()
    fig.savefig(png_path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def pick_device(name):
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def as_tensor(x, device):
    return torch.as_tensor(x, dtype=torch.float32, device=device)


def evaluate(args):
    """Play --eval-episodes episodes, one per env, with the training run's statistics frozen: the returns."""
    ckpt, device = load_checkpoint(args.eval), pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.eval_episodes, render=bool(args.gif))
    agent = Agent(envs.single_observation_space.shape[0], args, envs.single_action_space).to(device)
    agent.load_state_dict(ckpt["model"])  # the weights and the observation statistics of training
    low, high = envs.single_action_space.low, envs.single_action_space.high
    obs, _ = envs.reset(seed=args.seed)
    returns, finished, frames = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, bool), []
    while not finished.all():  # every episode ends, by itself or at the env's step limit
        if args.gif and not finished[0]:
            frames.append(envs.envs[0].render())
        with torch.no_grad():  # normalized with the saved statistics, which evaluation does not update
            x = agent.obs_norm(as_tensor(obs, device))
            action = agent.get_action_and_value(x, greedy=args.deterministic)[0]
        obs, reward, term, trunc, _ = envs.step(np.clip(action.cpu().numpy(), low, high))
        returns += reward * ~finished
        finished |= term | trunc
    envs.close()
    if args.gif:
        from PIL import Image
        images = [Image.fromarray(f).resize((f.shape[1] // 2, f.shape[0] // 2)) for f in frames[::2]]
        images[0].save(args.gif, save_all=True, append_images=images[1:], duration=40, loop=0)  # 25 frames/s
    print(f"eval {args.env_id}, {args.eval_episodes} episodes: {returns.mean():.1f} +- {returns.std():.1f}")
    return returns


def train(args):
    # ---------------------------------------------------------------- 1. setup
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = -(-args.total_timesteps // batch_size)  # rounded up: at least total_timesteps steps
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cudnn.benchmark = not args.torch_deterministic
    ckpt = load_checkpoint(args.resume) if args.resume else None
    args.run_dir = args.run_dir or f"runs/{args.env_id}__{SCRIPT}__{args.seed}__{int(time.time())}"
    os.makedirs(args.run_dir, exist_ok=True)
    path = {name: os.path.join(args.run_dir, name) for name in
            ("args.json", "episodes.csv", "updates.csv", "curve.png", "checkpoint.pt")}
    json.dump(asdict(args), open(path["args.json"], "w"), indent=2)

    envs = make_envs(args, args.num_envs)
    obs_dim, space = envs.single_observation_space.shape[0], envs.single_action_space
    agent = Agent(obs_dim, args, space).to(device)
    discounted_return = np.zeros(args.num_envs)  # each env's discounted return so far [cont-8]
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)  # [core-3]
    global_step, iteration, elapsed = 0, 0, 0.0
    if ckpt:
        agent.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        global_step, iteration, elapsed = ckpt["global_step"], ckpt["iteration"], ckpt["elapsed"]
    logs = {}  # on resume: the rows up to the checkpoint are kept, later ones dropped, new ones appended
    for name, header in (("episodes.csv", "global_step,wall_time,return,length"),
                         ("updates.csv", "global_step,sps,learning_rate,clip_coef,pg_loss,v_loss,entropy,"
                                         "approx_kl,clipfrac,explained_variance")):
        old = open(path[name]).read().split()[1:] if ckpt and os.path.exists(path[name]) else []
        logs[name] = open(path[name], "w")
        logs[name].write("\n".join([header] + [r for r in old if int(r.split(",")[0]) <= global_step]) + "\n")

    # Rollout storage, on the device. Observations and rewards are stored raw and scaled once the rollout is
    # over: the running statistics move only between updates, so the policy that acted and the update that
    # follows see one normalization, and the update recomputes exactly the log-probabilities that were stored.
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs) + space.shape, device=device)  # the Gaussian's u
    logprobs, rewards, dones, values, discounted, bootstraps = (  # each (num_steps, num_envs) float32
        torch.zeros((args.num_steps, args.num_envs), device=device) for _ in range(6))
    next_obs_np, _ = envs.reset(seed=args.seed + iteration * args.num_envs)
    next_obs = as_tensor(next_obs_np, device)  # (num_envs, obs_dim), raw
    next_done = torch.zeros(args.num_envs, device=device)
    episode_return, episode_length = np.zeros(args.num_envs), np.zeros(args.num_envs, dtype=int)
    recent, timer = [], dict(env=0.0, action=0.0, update=0.0)  # recent: the last 100 returns, for the bar

    stop = dict(signal=None, broken="")
    on_signal = lambda signum, frame: stop.update(signal=signum)  # finish the update, then save and leave
    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def save_all():
        """One place for the periodic save, the end, Ctrl-C, SIGTERM and a broken update."""
        for f in logs.values():
            f.flush()
        if not stop["broken"]:  # never overwrite the last good checkpoint with a broken model
            save_checkpoint(path["checkpoint.pt"], model=agent.state_dict(), optimizer=optimizer.state_dict(),
                            global_step=global_step, iteration=iteration, elapsed=elapsed, args=asdict(args))
        plot_curve(path["episodes.csv"], path["curve.png"], f"{SCRIPT}.py, {args.env_id}, seed {args.seed}")

    bar = tqdm(total=num_iterations * batch_size, initial=global_step, unit="step", dynamic_ncols=True)
    start, last_save = time.time() - elapsed, time.time()
    try:
        while iteration < num_iterations and stop["signal"] is None:
            iteration += 1
            t_iteration, step_at_start = time.time(), global_step
            # Schedules are functions of the iteration alone, so a resumed run picks them up where they were.
            frac = 1.0 - (iteration - 1.0) / num_iterations  # 1 at the first update, 1/num_iterations last
            lr = args.learning_rate * (frac if args.anneal_lr else 1.0)  # [core-4]
            optimizer.param_groups[0]["lr"] = lr

            # ------------------------------------------------------------ 2. rollout
            for step in range(args.num_steps):
                t0 = time.perf_counter()
                obs[step], dones[step] = next_obs, next_done
                with torch.no_grad():  # [cont-6, cont-7] normalized with the statistics of the last update
                    action, u, logprob, _, value = agent.get_action_and_value(agent.obs_norm(next_obs))
                actions[step], logprobs[step], values[step] = u, logprob, value
                action_np = action.cpu().numpy()  # the step's one wait on the device: the envs need it
                t1 = time.perf_counter()
                # [cont-5] clipped to the bounds on its way to the env; the unclipped u is what was stored
                next_obs_np, reward, term, trunc, info = envs.step(np.clip(action_np, space.low, space.high))
                global_step += args.num_envs
                episode_return, episode_length = episode_return + reward, episode_length + 1
                discounted_return = discounted_return * args.gamma + reward  # [cont-8] its std scales rewards
                rewards[step] = as_tensor(reward, device)
                discounted[step] = as_tensor(discounted_return, device)
                discounted_return[term | trunc] = 0
                # Truncation is not termination: gamma * V(final observation) joins the reward, after the
                # scaling. V sees it normalized like the rest of the rollout; it never moves the statistics.
                bootstrap = trunc & ~term  # terminated wins when both are set
                bootstraps[step] = 0  # the buffer is reused: no value may stay from an earlier rollout
                if bootstrap.any():
                    final_obs = agent.obs_norm(as_tensor(np.stack(info["final_obs"][bootstrap]), device))
                    with torch.no_grad():
                        bootstraps[step, bootstrap] = args.gamma * agent.get_value(final_obs)
                next_obs = as_tensor(next_obs_np, device)
                next_done = torch.as_tensor((term | trunc), dtype=torch.float32, device=device)
                for i in np.flatnonzero(term | trunc):
                    logs["episodes.csv"].write(f"{global_step},{time.time() - start:.1f},"
                                               f"{episode_return[i]:g},{episode_length[i]}\n")
                    recent = (recent + [episode_return[i]])[-100:]
                episode_return[term | trunc], episode_length[term | trunc] = 0, 0
                timer["action"] += t1 - t0
                timer["env"] += time.perf_counter() - t1  # the bookkeeping above counts as stepping

            # ------------------------------------------------------------ 3. advantages
            t0 = time.perf_counter()
            # [cont-8, cont-9] rewards divided by the std of the discounted return (its mean is not removed)
            agent.return_norm.update(discounted.flatten())
            scaled = (rewards / (agent.return_norm.var.float() + 1e-8).sqrt()).clamp(-10, 10) + bootstraps
            b_obs = agent.obs_norm(obs.flatten(0, 1))  # (batch_size, obs_dim), as the policy saw them
            with torch.no_grad():
                next_value = agent.get_value(agent.obs_norm(next_obs))
                advantages, returns = compute_gae(scaled, values, dones, next_value, next_done,
                                                  args.gamma, args.gae_lambda)

            # ------------------------------------------------------------ 4. update
            b_actions = actions.flatten(0, 1)  # (batch_size, action_dim)
            b_logprobs, b_advantages, b_returns, b_values = (x.flatten() for x in
                                                             (logprobs, advantages, returns, values))
            all_stats = []
            for epoch in range(args.update_epochs):
                b_inds = torch.randperm(batch_size, device=device)
                for begin in range(0, batch_size, minibatch_size):
                    mb_inds = b_inds[begin:begin + minibatch_size]
                    _, _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds],
                                                                                     b_actions[mb_inds])
                    mb_advantages = b_advantages[mb_inds]
                    if args.norm_adv:  # [core-7]
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    loss, stats = ppo_loss(newlogprob, b_logprobs[mb_inds], mb_advantages, newvalue,
                                           b_values[mb_inds], b_returns[mb_inds], entropy, args.clip_coef,
                                           args.vf_coef, args.ent_coef, args.clip_vloss)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)  # [core-11]
                    optimizer.step()
                    all_stats.append(torch.stack([loss.detach(), *stats.values()]))
                if args.target_kl is not None and stats["approx_kl"].item() > args.target_kl:  # [aux-3]
                    break
            # One conversion per update: a GPU is not waited for at every minibatch.
            loss_mean, *stat_means = torch.stack(all_stats).mean(0).tolist()
            timer["update"] += time.perf_counter() - t0
            if not np.isfinite(loss_mean):  # stop; keep the last good checkpoint; write the logs
                stop["broken"] = (f"non-finite loss in update {iteration} (global step {global_step}); "
                                  f"the last good checkpoint is kept in {path['checkpoint.pt']}")
                break
            agent.obs_norm.update(obs.flatten(0, 1))  # [cont-6] the statistics move here, between updates

            # ------------------------------------------------------------ 5. logging
            y_pred, y_true = values.cpu().numpy(), returns.cpu().numpy()
            explained_var = 1 - np.var(y_true - y_pred) / np.var(y_true) if np.var(y_true) > 0 else np.nan
            sps = (global_step - step_at_start) / (time.time() - t_iteration)
            row = [global_step, sps, lr, args.clip_coef, *stat_means, explained_var]
            logs["updates.csv"].write(",".join(f"{x:.6g}" for x in row) + "\n")
            bar.update(global_step - step_at_start)
            bar.set_postfix(ret=f"{np.mean(recent):.1f}" if recent else "-", sps=f"{sps:.0f}")
            elapsed = time.time() - start
            if time.time() - last_save > args.save_interval:
                save_all()
                last_save = time.time()
    finally:
        bar.close()
        save_all()
        envs.close()
        for f in logs.values():
            f.close()
        for s, handler in old_handlers.items():
            signal.signal(s, handler)
    if stop["broken"]:
        sys.exit(f"error: {stop['broken']}")
    total = max(sum(timer.values()), 1e-9)
    print(f"{global_step} steps, {time.time() - start:.0f} s; time split: " + ", ".join(
        f"{k} {v:.0f} s ({100 * v / total:.0f}%)" for k, v in timer.items()))
    if stop["signal"] is not None:
        print(f"stopped by signal {stop['signal']}; continue with --resume {path['checkpoint.pt']}")
    return args.run_dir


if __name__ == "__main__":
    args = parse_args()
    evaluate(args) if args.eval else train(args)
