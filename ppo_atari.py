"""PPO on Atari from pixels: Breakout, the classic preprocessing, a Nature CNN and the PPO paper's schedules.

    python ppo_atari.py                              # 10M steps of Breakout, the headline experiment
    python ppo_atari.py --total-timesteps 50000      # a short run that writes every output
    python ppo_atari.py --eval runs/<run>/checkpoint.pt --gif breakout.gif

Implements, tagged where the code does it with the numbering of "The 37 Implementation Details of PPO"
(Huang et al., 2022): core-1..13, atari-1..9, aux-1 (clip range annealed with the learning rate, the PPO
paper's Atari setting) and aux-3 (optional target-KL stop). The games are ale-py's AtariVectorEnv, which does
the whole classic preprocessing in C++ threads; tests/test_atari.py checks its frames against the
Stable-Baselines3 wrappers, pixel for pixel.
Left out on purpose: the classic wrappers pressed FIRE after every lost life. A vector env cannot step one
game alone, and an action the policy did not choose would corrupt the stored log-probabilities, so here the
agent learns to press FIRE itself (FIRE is still pressed when a new game starts).
Kept from CleanRL, not from the paper: 4 epochs (paper: 3) and value coefficient 0.5 (paper: 1). With one
network for actor and critic a larger value coefficient lets the value loss dominate the shared gradient;
CleanRL matched openai/baselines with these.

Paper: Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347. Expect a mean of
about 20 over the last 100 games after 1M steps (measured), and 400 after 10M (CleanRL's; ours: README.md).
"""
import argparse
import ctypes
import json
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch
import torch.nn as nn
from ale_py.roms import get_all_rom_ids
from ale_py.vector_env import AtariVectorEnv
from torch.distributions import Categorical
from tqdm import tqdm

SCRIPT, FORMAT = "ppo_atari", 1  # written into every checkpoint, so that a foreign file is recognised


def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    # experiment
    seed: int = arg(1, "seed of torch and of the games")
    torch_deterministic: bool = arg(True, "make cuDNN deterministic (same seed, same run)")
    device: str = arg("auto", "auto | cpu | cuda (auto takes CUDA when present)")
    bf16: bool = arg(False, "run the convolutions in bfloat16 autocast (weights and optimizer stay float32)")
    run_dir: str = arg("", "the run's folder (default runs/<game>__ppo_atari__<seed>__<unix time>)")
    save_interval: float = arg(300.0, "seconds between checkpoints (one is also written at the end)")
    resume: str = arg("", "continue the run of this checkpoint, with its arguments")
    eval: str = arg("", "play --eval-episodes games with this checkpoint's policy and print the scores")
    eval_episodes: int = arg(10, "games played by --eval")
    deterministic: bool = arg(False, "--eval takes the most likely action instead of sampling")
    gif: str = arg("", "--eval also writes the first game to this GIF file")
    # environment
    env_id: str = arg("Breakout", "ALE game: Breakout, BreakoutNoFrameskip-v4, ALE/Breakout-v5, breakout")
    total_timesteps: int = arg(10_000_000, "environment steps of the run (agent steps, 4 frames each)")
    num_envs: int = arg(8, "games stepped in parallel [core-1]")
    max_episode_frames: int = arg(108_000, "frames after which a game is cut off (30 minutes at 60 Hz)")
    # algorithm
    num_steps: int = arg(128, "steps per env per rollout")
    learning_rate: float = arg(2.5e-4, "Adam learning rate")
    anneal_lr: bool = arg(True, "anneal the learning rate linearly to 0 [core-4]")
    anneal_clip: bool = arg(True, "anneal the clip range linearly to 0, as the PPO paper on Atari [aux-1]")
    gamma: float = arg(0.99, "discount factor")
    gae_lambda: float = arg(0.95, "GAE lambda [core-5]")
    num_minibatches: int = arg(4, "minibatches per epoch [core-6]")
    update_epochs: int = arg(4, "passes over each rollout")
    norm_adv: bool = arg(True, "normalize advantages per minibatch [core-7]")
    clip_coef: float = arg(0.1, "clip range of the policy ratio and of the value [core-8, core-9]")
    clip_vloss: bool = arg(True, "clip the value loss [core-9]")
    ent_coef: float = arg(0.01, "entropy bonus coefficient [core-10]")
    vf_coef: float = arg(0.5, "value loss coefficient [core-10]")
    max_grad_norm: float = arg(0.5, "global gradient norm clip [core-11]")
    target_kl: float = arg(None, "stop an update's epochs once approx_kl exceeds this [aux-3]; None: off")


def rom_id(env_id):
    """'Breakout', 'BreakoutNoFrameskip-v4', 'ALE/Breakout-v5', 'breakout' -> 'breakout'; None if no game."""
    name = re.sub(r"(NoFrameskip|Deterministic)?(-v\d+)?$", "", env_id.split("/")[-1])
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()  # MsPacman -> ms_pacman
    return name if name in get_all_rom_ids() else None


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
    batch_size = args.num_envs * args.num_steps
    positive = ["total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs",
                "learning_rate", "clip_coef", "max_episode_frames", "eval_episodes"]
    checks = [(getattr(args, k) > 0, f"--{k.replace('_', '-')} must be positive") for k in positive] + [
        (batch_size % max(args.num_minibatches, 1) == 0,
         f"--num-minibatches must divide num_envs * num_steps = {batch_size}"),
        (0 <= args.gamma <= 1 and 0 <= args.gae_lambda <= 1, "--gamma and --gae-lambda must lie in [0, 1]"),
        (args.device in ("auto", "cpu", "cuda"), "--device must be auto, cpu or cuda"),
        (args.device != "cuda" or torch.cuda.is_available(), "--device cuda: no CUDA GPU is visible"),
        (rom_id(args.env_id) is not None, f"--env-id {args.env_id!r} is not an ALE game; list the games with "
         "python -c 'import ale_py.roms; print(ale_py.roms.get_all_rom_ids())'")]
    for ok, message in checks:
        if not ok:
            p.error(message)
    return args


def make_envs(args, num_envs, training=True, **overrides):
    """The games, preprocessed in C++ threads; `overrides` lets the tests switch off the random no-ops."""
    settings = dict(
        noop_max=30,                                  # [atari-1] up to 30 no-ops when a game starts
        frameskip=4, maxpool=True,                    # [atari-2] each action 4 frames, max of the last 2
        life_loss_info=training,                      # [atari-3] a lost life ends the episode, not the game
        use_fire_reset=True,                          # [atari-4] press FIRE when a game starts
        img_height=84, img_width=84, grayscale=True,  # [atari-5]
        reward_clipping=False,                        # [atari-6] done in the loop, to keep the true score
        stack_num=4,                                  # [atari-7]
        repeat_action_probability=0.0,                # no sticky actions, as in the published PPO results
        max_num_frames_per_episode=args.max_episode_frames,
        autoreset_mode="SameStep",                    # a finished game restarts in the same step (SPEC.md)
    )
    return AtariVectorEnv(rom_id(args.env_id), num_envs, **{**settings, **overrides})


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)  # [core-2] orthogonal weights, constant bias
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature CNN, one trunk for the actor and the critic [atari-8, core-13]."""

    def __init__(self, num_actions, bf16=False):
        super().__init__()
        self.bf16 = bf16
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),   # (B, 32, 20, 20)
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),  # (B, 64, 9, 9)
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),  # (B, 64, 7, 7)
            nn.Flatten(), layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)  # a near-uniform first policy
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def hidden(self, x):
        # x: (B, 4, 84, 84) uint8, scaled to [0, 1] only here [atari-9]. Channels-last convolutions run about
        # twice as fast on CPU (FACTS.md); Flatten still reads the features in the usual order. The heads stay
        # float32, so log-probabilities are float32 with --bf16 too.
        with torch.autocast(x.device.type, torch.bfloat16, enabled=self.bf16):
            return self.network(x.to(torch.float32, memory_format=torch.channels_last).mul_(1 / 255)).float()

    def get_value(self, x):
        return self.critic(self.hidden(x)).squeeze(-1)

    def get_action_and_value(self, x, action=None, greedy=False):
        hidden = self.hidden(x)
        logits = self.actor(hidden)
        dist = Categorical(logits=logits, validate_args=False)
        if action is None:
            action = logits.argmax(-1) if greedy else dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(hidden).squeeze(-1)


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


def keep_freed_memory():
    """Keep the memory the update frees. By default glibc hands freed blocks at the top of its heap back to
    the kernel, and every minibatch page-faults its tens of MB of inputs and activations in again: on the
    2-core CPU a 30k-step default run made 7 million page faults and spent 12 of its 53 s in the kernel."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not Linux with glibc: its allocator, its defaults
        return
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks under 32 MB come from the heap, not from mmap
    libc.mallopt(-1, 1 << 30)   # M_TRIM_THRESHOLD: the heap keeps up to 1 GB of freed memory for reuse


def pick_device(name):
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def evaluate(args):
    """Play --eval-episodes whole games (all lives), one per env, and report their unclipped scores."""
    ckpt, device = load_checkpoint(args.eval), pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.eval_episodes, training=False)  # a game ends when its last life is lost
    agent = Agent(envs.single_action_space.n, args.bf16).to(device, memory_format=torch.channels_last)
    agent.load_state_dict(ckpt["model"])
    obs, _ = envs.reset(seed=args.seed)
    scores, finished, frames = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, bool), []
    while not finished.all():  # every game ends, by itself or at --max-episode-frames: no hang
        if args.gif and not finished[0]:
            frames.append(obs[0, -1])  # the newest 84x84 frame of game 0: what the agent sees
        with torch.no_grad():
            x = torch.from_numpy(obs).to(device)
            action, _, _, _ = agent.get_action_and_value(x, greedy=args.deterministic)
        obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
        scores += reward * ~finished
        finished |= term | trunc
    envs.close()
    if args.gif:
        from PIL import Image
        images = [Image.fromarray(f).resize((252, 252), Image.NEAREST) for f in frames]
        images[0].save(args.gif, save_all=True, append_images=images[1:], duration=67, loop=0)  # 15 steps/s
    print(f"eval {args.env_id} over {args.eval_episodes} games: {scores.mean():.1f} +- {scores.std():.1f}")
    return scores


def train(args):
    # ---------------------------------------------------------------- 1. setup
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = -(-args.total_timesteps // batch_size)  # rounded up: at least total_timesteps steps
    device = pick_device(args.device)
    keep_freed_memory()
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cudnn.benchmark = not args.torch_deterministic
    ckpt = load_checkpoint(args.resume) if args.resume else None
    args.run_dir = args.run_dir or f"runs/{rom_id(args.env_id)}__{SCRIPT}__{args.seed}__{int(time.time())}"
    os.makedirs(args.run_dir, exist_ok=True)
    path = {name: os.path.join(args.run_dir, name) for name in
            ("args.json", "episodes.csv", "updates.csv", "curve.png", "checkpoint.pt")}
    json.dump(asdict(args), open(path["args.json"], "w"), indent=2)

    envs = make_envs(args, args.num_envs)
    agent = Agent(envs.single_action_space.n, args.bf16).to(device, memory_format=torch.channels_last)
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

    # Rollout storage, on the device. Observations stay uint8: a quarter of the memory and of the copying.
    obs = torch.zeros((args.num_steps, args.num_envs, 4, 84, 84), dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs, rewards, dones, values = (torch.zeros((args.num_steps, args.num_envs), device=device)
                                        for _ in range(4))  # each (num_steps, num_envs) float32
    # A resumed run starts new games (an emulator's state is not saved), with seeds not used before.
    next_obs_np, info = envs.reset(seed=args.seed + iteration * args.num_envs)
    next_obs = torch.from_numpy(next_obs_np).to(device)  # (num_envs, 4, 84, 84) uint8
    next_done = torch.zeros(args.num_envs, device=device)
    game_score, game_length = np.zeros(args.num_envs), np.zeros(args.num_envs, dtype=int)
    frame_number = info["episode_frame_number"].copy()
    recent, timer = [], dict(env=0.0, action=0.0, update=0.0)  # recent: the last 100 scores, for the bar

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
        plot_curve(path["episodes.csv"], path["curve.png"], f"{SCRIPT}.py, {args.env_id}, seed {args.seed}",
                   "game score (unclipped; one episode = one game)")

    bar = tqdm(total=num_iterations * batch_size, initial=global_step, unit="step", dynamic_ncols=True)
    start, last_save = time.time() - elapsed, time.time()
    try:
        while iteration < num_iterations and stop["signal"] is None:
            iteration += 1
            t_iteration, step_at_start = time.time(), global_step
            # Schedules are functions of the iteration alone, so a resumed run picks them up where they were.
            frac = 1.0 - (iteration - 1.0) / num_iterations  # 1 at the first update, 1/num_iterations last
            lr = args.learning_rate * (frac if args.anneal_lr else 1.0)  # [core-4]
            clip_coef = args.clip_coef * (frac if args.anneal_clip else 1.0)  # [aux-1]
            optimizer.param_groups[0]["lr"] = lr

            # ------------------------------------------------------------ 2. rollout
            for step in range(args.num_steps):
                t0 = time.perf_counter()
                obs[step], dones[step] = next_obs, next_done
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                actions[step], logprobs[step], values[step] = action, logprob, value
                action_np = action.cpu().numpy()  # the step's one wait on the device: the games need it
                t1 = time.perf_counter()
                next_obs_np, reward, term, trunc, info = envs.step(action_np)
                global_step += args.num_envs
                # The score is the game's own reward; the agent learns from its sign only [atari-6].
                game_score, game_length = game_score + reward, game_length + 1
                train_reward = np.sign(reward).astype(np.float32)
                # Truncation is not termination: bootstrap from V(final observation), which the games only
                # report when a game restarted (FACTS.md). When both are set, terminated wins.
                bootstrap = trunc & ~term
                if bootstrap.any():
                    final_obs = torch.from_numpy(info["final_obs"][bootstrap]).to(device)
                    with torch.no_grad():
                        final_value = agent.get_value(final_obs)
                    train_reward[bootstrap] += args.gamma * final_value.cpu().numpy()
                rewards[step] = torch.from_numpy(train_reward).to(device)
                next_obs = torch.from_numpy(next_obs_np).to(device)
                next_done = torch.from_numpy((term | trunc).astype(np.float32)).to(device)
                # A lost life is a done for GAE [atari-3], yet the score adds up until the game is over, which
                # shows as the frame counter going back: the info is already the next game's (FACTS.md).
                game_over = (term | trunc) & (info["episode_frame_number"] < frame_number)
                frame_number = info["episode_frame_number"].copy()
                for i in np.flatnonzero(game_over):
                    logs["episodes.csv"].write(f"{global_step},{time.time() - start:.1f},"
                                               f"{game_score[i]:g},{game_length[i]}\n")
                    recent = (recent + [game_score[i]])[-100:]
                game_score[game_over], game_length[game_over] = 0, 0
                timer["action"] += t1 - t0
                timer["env"] += time.perf_counter() - t1  # the bookkeeping above counts as stepping

            # ------------------------------------------------------------ 3. advantages
            t0 = time.perf_counter()
            with torch.no_grad():
                next_value = agent.get_value(next_obs)
                advantages, returns = compute_gae(rewards, values, dones, next_value, next_done,
                                                  args.gamma, args.gae_lambda)

            # ------------------------------------------------------------ 4. update
            b_obs = obs.reshape(-1, 4, 84, 84)  # (batch_size, 4, 84, 84) uint8
            b_actions, b_logprobs, b_advantages, b_returns, b_values = (
                x.reshape(-1) for x in (actions, logprobs, advantages, returns, values))  # (batch_size,)
            all_stats = []
            for epoch in range(args.update_epochs):
                perm = torch.randperm(batch_size, device=device)
                for begin in range(0, batch_size, minibatch_size):
                    mb = perm[begin:begin + minibatch_size]
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
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

            # ------------------------------------------------------------ 5. logging
            y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
            explained_var = 1 - np.var(y_true - y_pred) / np.var(y_true) if np.var(y_true) > 0 else np.nan
            sps = (global_step - step_at_start) / (time.time() - t_iteration)
            row = [global_step, sps, lr, clip_coef, *stat_means, explained_var]
            logs["updates.csv"].write(",".join(f"{x:.6g}" for x in row) + "\n")
            bar.update(global_step - step_at_start)
            bar.set_postfix(score=f"{np.mean(recent):.1f}" if recent else "-", sps=f"{sps:.0f}")
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
