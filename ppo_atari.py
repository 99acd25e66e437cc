"""PPO on Atari from pixels: Breakout, the classic preprocessing, a Nature CNN, annealed schedules.

    python ppo_atari.py                            # 10M steps of Breakout, the headline run
    python ppo_atari.py --total-timesteps 50000    # a short run that writes every output
    python ppo_atari.py --eval runs/<run>/checkpoint.pt --gif breakout.gif

Tags name "The 37 Implementation Details of PPO" (Huang et al., 2022): core-1..13, atari-1..9, aux-1
(clip range annealed with the learning rate, as the PPO paper on Atari), aux-3 (target-KL stop).
Left out on purpose: pressing FIRE after a lost life, which would store actions the policy did not
choose; the agent learns to press it. From CleanRL, not the paper: 4 epochs (paper 3), value
coefficient 0.5 (paper 1). Schulman et al. 2017, arXiv:1707.06347. Expect a mean of about 20 over
the last 100 games after 1M steps, and about 400 after 10M (CleanRL's published score).
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

import numpy as np
import torch
import torch.nn as nn
from ale_py.roms import get_all_rom_ids
from ale_py.vector_env import AtariVectorEnv
from torch.distributions import Categorical
from tqdm import tqdm

SCRIPT = "ppo_atari"  # written into every checkpoint, so that a foreign file is recognised
FORMAT = 2  # the checkpoint's layout (2: no --bf16)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, and what a job scheduler sends


@dataclass
class Args:  # every flag: --help shows the comment after each field
    # experiment
    seed: int = 1  # seed of torch and of the games
    torch_deterministic: bool = True  # same seed, same run: deterministic cuDNN, no TF32
    device: str = "auto"  # auto (CUDA when present), cpu or cuda
    cuda_graphs: bool = True  # on CUDA, record the action step and the update, then replay them
    run_dir: str = ""  # the run's folder (empty: runs/<env>__ppo_atari__<seed>__<unix time>)
    save_interval: float = 300.0  # seconds between checkpoints (one is also written at the end)
    resume: str = ""  # continue the run of this checkpoint, with the arguments saved in it
    eval: str = ""  # play --eval-episodes episodes with this checkpoint's policy, print the returns
    eval_episodes: int = 10  # episodes played by --eval
    deterministic: bool = False  # --eval takes the most likely action instead of sampling
    gif: str = ""  # --eval also writes the first episode to this GIF file
    # environment
    env_id: str = "Breakout"  # ALE game: Breakout, BreakoutNoFrameskip-v4, ALE/Breakout-v5...
    total_timesteps: int = 10_000_000  # environment steps of the run (4 frames each)
    num_envs: int = 8  # games stepped in parallel [core-1]
    max_episode_frames: int = 108_000  # frames after which a game is cut off (30 min at 60 Hz)
    # algorithm
    num_steps: int = 128  # steps per game per rollout
    learning_rate: float = 2.5e-4  # Adam's learning rate at the start
    num_minibatches: int = 4  # minibatches per epoch [core-6]
    update_epochs: int = 4  # passes over each rollout
    clip_coef: float = 0.1  # clip range of the policy ratio and of the value [core-8, core-9]
    ent_coef: float = 0.01  # entropy bonus coefficient [core-10]
    anneal_clip: bool = True  # anneal the clip range linearly to 0, as the PPO paper [aux-1]
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
    if rom_id(args.env_id) is None:
        parser.error(f"--env-id {args.env_id!r}: no such game in ale_py.roms.get_all_rom_ids()")
    if args.gif and not args.eval:
        parser.error("--gif goes with --eval")
    folder = args.run_dir or "runs"
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
    if not args.eval and not os.access(folder, os.W_OK):
        parser.error(f"--run-dir {folder}: cannot create or write that folder")
    return args


def rom_id(env_id):
    """'Breakout', 'BreakoutNoFrameskip-v4', 'ALE/Breakout-v5' -> 'breakout'; None if no game."""
    name = re.sub(r"(NoFrameskip|Deterministic)?(-v\d+)?$", "", env_id.split("/")[-1])
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()  # MsPacman -> ms_pacman
    return name if name in get_all_rom_ids() else None


def make_envs(args, num_envs, training=True, **overrides):
    """The games, preprocessed by ale-py in C++ threads (tests/test_atari.py checks its frames
    against Stable-Baselines3's wrappers). `overrides` lets the tests turn off the no-ops."""
    settings = dict(
        noop_max=30,                  # [atari-1] up to 30 no-ops when a game starts
        frameskip=4, maxpool=True,    # [atari-2] an action lasts 4 frames; max of the last 2
        life_loss_info=training,      # [atari-3] a lost life ends the episode, not the game
        use_fire_reset=True,          # [atari-4] press FIRE when a game starts
        img_height=84, img_width=84,  # [atari-5] 84x84, grayscale (the default)
        reward_clipping=False,        # [atari-6] done in the loop, to keep the true score
        stack_num=4,                  # [atari-7] the last 4 frames
        repeat_action_probability=0,  # no sticky actions, as in the published results
        max_num_frames_per_episode=args.max_episode_frames,
        autoreset_mode="SameStep",  # restart in the same step, not a junk step later
    )
    return AtariVectorEnv(rom_id(args.env_id), num_envs, **{**settings, **overrides})


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)  # [core-2] orthogonal weights, constant bias
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature CNN, one trunk for the actor and the critic [atari-8, core-13]."""
    def __init__(self, num_actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),   # (B, 32, 20, 20)
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),  # (B, 64, 9, 9)
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),  # (B, 64, 7, 7)
            nn.Flatten(),                                           # (B, 3136)
            layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),      # (B, 512)
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)  # nearly uniform at first
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def features(self, x):
        """x: (B, 4, 84, 84) uint8 frames -> (B, 512) float32 features."""
        # [atari-9] Scaled here: uint8 frames travel. Channels-last is 2x faster on a CPU.
        return self.network(x.to(torch.float32, memory_format=torch.channels_last).mul_(1 / 255))

    @torch.no_grad()  # for the rollout only
    def get_value(self, x):
        return self.critic(self.features(x)).squeeze(-1)

    def get_action_and_value(self, x, action=None, greedy=False):
        """The action (sampled, unless given), its log-probability, the entropy and V(x)."""
        features = self.features(x)
        logits = self.actor(features)
        dist = Categorical(logits=logits, validate_args=False)
        if action is None:
            action = logits.argmax(-1) if greedy else dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(features).squeeze(-1)


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
    graphs = args.cuda_graphs and device.type == "cuda"
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # cuDNN convolves in TF32 by default (a 10-bit mantissa): the update would then recompute the
    # rollout's log-probabilities only to about 1e-4, and an update's first ratio would not be 1.
    torch.backends.cudnn.allow_tf32 = not args.torch_deterministic
    agent = Agent(envs.single_action_space.n).to(device, memory_format=torch.channels_last)
    # [core-3] eps 1e-5. capturable: the step count lives on the device, for a recorded update.
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=args.learning_rate, eps=1e-5, capturable=graphs)
    iteration = 0  # updates done
    if args.resume:
        ckpt = load_checkpoint(args.resume)
        agent.load_state_dict(ckpt["model"])
        ckpt["optimizer"]["param_groups"][0]["capturable"] = graphs  # this device's choice
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
    # Frames stay uint8 until the network: a quarter of the memory and of the copying.
    obs = torch.zeros(shape + (4, 84, 84), dtype=torch.uint8, device=device)
    actions = torch.zeros(shape, dtype=torch.long, device=device)
    obs_on_device = partial(torch.as_tensor, device=device)  # keeps the dtype
    score = np.zeros(args.num_envs)  # each game's unclipped score so far
    frame_number = info["episode_frame_number"].copy()
    eager_iteration = iteration  # creates Adam's state and cuDNN's choices, which graphs cannot

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
            clip_coef = args.clip_coef * (frac if args.anneal_clip else 1.0)  # [aux-1]
            if graphs and iteration == eager_iteration + 1:  # the action step is recorded once
                policy = cuda_graph(policy, obs[0].clone())
            # ------------------------------------------------------------ 2. rollout
            bootstraps.zero_()  # the buffer is reused: no value may stay from a past rollout
            for step in range(args.num_steps):
                obs[step] = obs_on_device(next_obs)
                dones[step] = next_done
                actions[step], logprobs[step], _, values[step] = policy(obs[step])
                action_np = actions[step].cpu().numpy()  # the step's one wait for the device
                next_obs, reward, term, trunc, info = envs.step(action_np)
                next_done = term | trunc
                global_step += args.num_envs
                score += reward
                length += 1
                # [atari-6] The agent learns from the reward's sign, the score adds the reward.
                rewards[step] = np.sign(reward)
                # Truncation is not termination: gamma * V(final obs) joins the reward GAE sees.
                bootstrap = trunc & ~term  # terminated wins when both are set
                if bootstrap.any():
                    final_obs = obs_on_device(np.stack(info["final_obs"][bootstrap]))
                    bootstraps[step, bootstrap] = args.gamma * agent.get_value(final_obs)
                # A lost life is a done for GAE [atari-3], but the score adds up to the game's end.
                # That shows as the frame counter going back: the info is the next game's already.
                game_over = next_done & (info["episode_frame_number"] < frame_number)
                frame_number = info["episode_frame_number"].copy()
                for i in np.flatnonzero(game_over):
                    wall_time = round(time.time() - start, 1)
                    write_row(logs["episodes.csv"], [global_step, wall_time, score[i], length[i]])
                    recent = recent[-99:] + [score[i]]
                    score[i] = 0
                    length[i] = 0
            # ------------------------------------------------------------ 3. advantages
            gae_rewards = on_device(rewards) + bootstraps
            next_value = agent.get_value(obs_on_device(next_obs))
            advantages, returns = compute_gae(gae_rewards, values, on_device(dones), next_value,
                                              on_device(next_done), args.gamma, args.gae_lambda)
            # ------------------------------------------------------------ 4. update
            flat = [x.flatten(0, 1) for x in (obs, actions, logprobs, advantages, returns, values)]
            update = partial(minibatch_step, agent, optimizer, args, flat, clip_coef)
            if graphs and iteration > eager_iteration:  # recorded anew: lr and clip range change
                update = cuda_graph(update, torch.zeros(minibatch_size, dtype=int, device=device))
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
def pick_device(name):
    auto = "cuda" if torch.cuda.is_available() else "cpu"  # the CNN runs faster on any GPU
    return torch.device(auto if name == "auto" else name)


def cuda_graph(fn, *inputs):
    """fn(*inputs) recorded once as a CUDA graph, and a function that replays it. A small network
    keeps a GPU waiting while Python launches its kernels one by one; a replay launches them all.
    A replay copies new inputs into `inputs` and returns the same output tensors every time (read
    them before the next). No Python runs then: numbers fn read (a learning rate) stay fixed."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn(*inputs)
    def replay(*new_inputs):
        for buffer, x in zip(inputs, new_inputs):
            buffer.copy_(x)
        graph.replay()
        return outputs
    return replay


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
    envs = make_envs(args, args.eval_episodes, training=False)  # a game ends with its last life
    agent = Agent(envs.single_action_space.n).to(device, memory_format=torch.channels_last)
    agent.load_state_dict(load_checkpoint(args.eval)["model"])
    obs, _ = envs.reset(seed=args.seed)
    scores = np.zeros(args.eval_episodes)
    over = np.zeros(args.eval_episodes, bool)
    frames = []  # episode 0's frames, for --gif
    while not over.all():  # every episode ends, by itself or at its step limit
        if args.gif and not over[0]:
            frames.append(np.kron(obs[0, -1], np.ones((3, 3), np.uint8)))  # newest, 3x as big
        with torch.no_grad():
            x = torch.from_numpy(obs).to(device)
            action = agent.get_action_and_value(x, greedy=args.deterministic)[0]
        obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
        scores += reward * ~over
        over |= term | trunc
    envs.close()
    if args.gif:
        from PIL import Image
        images = [Image.fromarray(frame) for frame in frames]  # 15 steps a second
        images[0].save(args.gif, save_all=True, append_images=images[1:], duration=67, loop=0)
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
