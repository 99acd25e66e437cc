"""PPO on Atari from pixels: Breakout, the classic
preprocessing, a Nature CNN, annealed schedules.

    python ppo_atari.py        # Breakout, 10M steps
    python ppo_atari.py --eval runs/<run> --gif game.gif

The network, the preprocessing and the settings are
CleanRL's (8 games x 128 steps, 4 epochs of 4 minibatches,
Adam 2.5e-4, clip 0.1, entropy 0.01). Unlike CleanRL's, the
clip range anneals with the learning rate, as in the PPO
paper; nothing presses FIRE after a lost life (the policy
learns to); a game cut by the frame cap is bootstrapped.
Tags such as [core-7] number the details of "The 37
Implementation Details of PPO" (Huang et al., 2022), listed
in the README. Left out: the target-KL stop (aux-3), and
CUDA graphs and torch.compile, which make a GPU faster but
hide the flow (docs/ppo_atari.md says what they gave).
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

import numpy as np
import torch
import torch.nn as nn
from ale_py.roms import get_all_rom_ids
from ale_py.vector_env import AtariVectorEnv
from filelock import FileLock, Timeout
from torch.distributions import Categorical
from tqdm import tqdm

SCRIPT = "ppo_atari"  # in every checkpoint
FORMAT = 4  # the checkpoint's layout

@dataclass
class Args:  # --help shows the comment after each field
    env_id: str = "Breakout"  # An ALE game (Pong, ALE/Pong-v5).
    total_timesteps: int = 10_000_000  # Steps of the run.
    num_envs: int = 8  # Games stepped side by side.
    max_episode_frames: int = 108_000  # A game's frame cap (30 minutes).
    num_steps: int = 128  # Steps per game in each rollout.
    learning_rate: float = 2.5e-4  # Adam's rate at the start.
    num_minibatches: int = 4  # Minibatches per epoch.
    update_epochs: int = 4  # Passes over each rollout.
    clip_coef: float = 0.1  # How far the ratio may leave 1, at first.
    ent_coef: float = 0.01  # Weight of the entropy bonus.
    anneal_clip: bool = True  # Shrink the clip range linearly.
    anneal_lr: bool = True  # Shrink the learning rate linearly.
    gamma: float = 0.99  # The discount factor.
    gae_lambda: float = 0.95  # GAE's lambda.
    norm_adv: bool = True  # Normalize advantages.
    clip_vloss: bool = True  # Clip the value loss too.
    vf_coef: float = 0.5  # Weight of the value loss.
    max_grad_norm: float = 0.5  # Largest gradient norm.
    seed: int = 1  # Seed of torch and the games, at most 2**30.
    device: str = "auto"  # auto (CUDA if any), cpu or cuda.
    torch_deterministic: bool = True  # Deterministic cuDNN, no TF32.
    run_dir: str = ""  # The run's folder (default: runs/...).
    save_interval: float = 300.0  # Seconds between saves.
    resume: str = ""  # Continue the run in this folder.
    eval: str = ""  # Play the policy of this run's folder.
    eval_episodes: int = 10  # Games --eval plays.
    deterministic: bool = False  # Play the likeliest action.
    gif: str = ""  # With --eval: a GIF of the first game.

def make_envs(args, num_envs, **overrides):
    """[core-1] num_envs games side by side, stepped by ale-py in
    C++ threads, with DeepMind's DQN preprocessing (the tests
    check its frames against Stable-Baselines3's wrappers)."""
    # [atari-1] 0-29 no-op frames at a reset vary the starts.
    # [atari-2] Each action lasts 4 frames, and the last two
    # are max-pooled, for the sprites that flicker.
    # [atari-3] A lost life ends an episode for learning but
    # not the game; nothing presses FIRE after it, so the
    # policy learns to press it. [atari-4] FIRE starts a game.
    # [atari-5] Frames grey and 84x84; [atari-7] the last 4
    # stacked, so that motion can be seen. [atari-6] Rewards
    # become their sign in train(), which logs true scores.
    # So a step's term is a lost life (the game goes on) or a
    # game over, and trunc the frame cap. A game over or a cap
    # resets the game in that same step: next_obs is the new
    # game's first frames, info["final_obs"] the old one's last.
    settings = dict(
        noop_max=30,  # [atari-1] 0-29 no-ops
        frameskip=4, maxpool=True,  # [atari-2] max of last 2
        life_loss_info=True,  # [atari-3] a lost life ends an episode
        use_fire_reset=True,  # [atari-4] FIRE at a reset
        img_height=84, img_width=84,  # [atari-5] grey
        reward_clipping=False,  # [atari-6] in train()
        stack_num=4,  # [atari-7] the last 4 frames
        repeat_action_probability=0,  # no sticky actions
        max_num_frames_per_episode=args.max_episode_frames,
        autoreset_mode="SameStep")  # reset in the step a game ends
    return AtariVectorEnv(rom_id(args.env_id), num_envs, **(settings | overrides))

def layer_init(layer, std=2 ** 0.5):
    # [core-2] Orthogonal weights keep the signal's scale at first;
    # the gain sqrt(2) makes up for the half that ReLU zeroes.
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.zeros_(layer.bias)
    return layer

class Agent(nn.Module):
    """[atari-8, core-13] The Nature CNN, one trunk shared by
    the actor and the critic: both heads learn from one set
    of visual features, computed once per frame."""

    def __init__(self, envs, args):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(), layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU())
        # Small last weights: all actions about as likely.
        self.actor = layer_init(nn.Linear(512, envs.single_action_space.n), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def features(self, x):  # uint8 (B, 4, 84, 84) -> (B, 512)
        # [atari-9] Frames stay uint8 until here, then go to [0, 1].
        # The channels-last memory layout makes a CPU's convolutions 1.6-2x faster.
        x = x.to(torch.float32, memory_format=torch.channels_last)
        return self.network(x * (1 / 255))

    @torch.no_grad()  # V for GAE: no gradients
    def get_value(self, x):
        return self.critic(self.features(x)).squeeze(-1)

    def get_action_and_value(self, x, action=None, greedy=False):
        """x: (B, 4, 84, 84); action: (B,) to score, or None
        to draw. -> action, log pi(action|x), entropy, V(x)."""
        features = self.features(x)
        logits = self.actor(features)
        dist = Categorical(logits=logits, validate_args=False)  # no checks: faster
        if action is None:
            action = logits.argmax(-1) if greedy else dist.sample()
        value = self.critic(features).squeeze(-1)
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
# V(s_T) = next_value, d_T = next_done, A_T = 0. A game cut by
# the frame cap adds its own V to the reward first (train()).
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
# code: past e from the rollout's V, the loss stops pulling V
# on. For the ratio e is relative; for V it is in the return's
# units, a small step where returns reach tens, as Breakout's
# clipped rewards soon sum to. e anneals here [aux-1]: late in
# a run the critic too moves little in an update.
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

def update(agent, optimizer, args, batch, clip_coef):
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
                entropy=entropy, clip_coef=clip_coef, vf_coef=args.vf_coef,
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
    device = pick_device(args.device, args.torch_deterministic)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.num_envs)
    agent = Agent(envs, args).to(device, memory_format=torch.channels_last)
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
    on_device = partial(torch.as_tensor, device=device)
    obs = torch.zeros(shape + (4, 84, 84), dtype=torch.uint8, device=device)
    actions = torch.zeros(shape, dtype=int, device=device)
    logprobs = torch.zeros(shape, device=device)
    values = torch.zeros(shape, device=device)
    rewards = np.zeros(shape, np.float32)
    dones = np.zeros(shape, np.float32)
    # A resumed run starts new games, seeded past the earlier ones.
    # ALE's seeds are 32-bit: --seed is at most 2**30 (parse_args),
    # so seeds stay below 2**31 while (iteration+1) x envs <= 2**30.
    next_obs, _ = envs.reset(seed=args.seed + iteration * args.num_envs)
    next_done = np.zeros(args.num_envs, bool)
    with Run(args, num_iterations * batch_size, ckpt) as run:
        while iteration < num_iterations and not run.stop:
            # [core-4, aux-1] The learning rate and the clip range fall
            # linearly with the iteration (a resume goes on), to
            # 1/num_iterations of their first values in the last update.
            frac = 1.0 - iteration / num_iterations
            lr = args.learning_rate * (frac if args.anneal_lr else 1.0)
            clip_coef = args.clip_coef * (frac if args.anneal_clip else 1.0)
            optimizer.param_groups[0]["lr"] = lr
            # ---- 2. rollout
            for step in range(args.num_steps):
                obs[step] = torch.from_numpy(next_obs)  # copied in place
                dones[step] = next_done  # 1: obs[step] starts an episode
                with torch.no_grad():  # the rollout only acts
                    acted = agent.get_action_and_value(obs[step])  # a, log pi(a), H, V
                actions[step], logprobs[step], _, values[step] = acted
                next_obs, reward, term, trunc, info = envs.step(actions[step].cpu().numpy())
                next_done = term | trunc
                global_step += args.num_envs
                rewards[step] = np.sign(reward)  # [atari-6]
                run.episodes(global_step, reward, next_done, info)  # logs whole games
                # A game cut by the frame cap was not lost: it would have
                # gone on. The env has reset it (its last frames are in
                # info["final_obs"]), and GAE, seeing a done, drops
                # V(next_obs), the new game's: gamma V(the cut game's last
                # frames) joins that step's reward instead.
                cut = trunc & ~term
                if cut.any():
                    final_obs = on_device(np.stack(info["final_obs"][cut]))
                    rewards[step, cut] += args.gamma * agent.get_value(final_obs).cpu().numpy()
            # ---- 3. advantages
            advantages, returns = compute_gae(on_device(rewards), values, on_device(dones),
                                              agent.get_value(on_device(next_obs)),
                                              on_device(next_done), args.gamma, args.gae_lambda)
            # ---- 4. update
            batch = dict(obs=obs, actions=actions, logprobs=logprobs,
                         advantages=advantages, returns=returns, values=values)
            means = update(agent, optimizer, args, batch, clip_coef)
            if not all(p.isfinite().all() for p in agent.parameters()):  # a step diverged
                sys.exit(f"error: non-finite weights after update {iteration + 1}")
            iteration += 1
            # ---- 5. logging
            state = dict(model=agent.state_dict(), optimizer=optimizer.state_dict(),
                         iteration=iteration, global_step=global_step)
            run.log_update(global_step, state, learning_rate=lr, clip_coef=clip_coef, **means,
                           explained_variance=explained_variance(values, returns))
    envs.close()

# ==== Plumbing: flags, bookkeeping, evaluation ====
PLAY = {"eval_episodes", "deterministic", "gif", "seed"}  # --eval's own; the rest: the run's
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
    args.run_dir = args.run_dir or f"runs/{args.env_id}__{SCRIPT}__{args.seed}__{time.time_ns()}"
    value = vars(args)  # each flag's, by name
    # Any other number is a size or a rate.
    sizes = [k for k, x in value.items() if type(x) in [int, float] and k not in ZERO_OK]
    # ALE's integers are 32-bit.
    rules += [(k, "in (0, 2**31)", 0 < value[k] < 2**31) for k in sizes]
    rules += [(k, "in [0, 1]", 0 <= value[k] <= 1) for k in ["gamma", "gae_lambda"]]
    rules += [(k, "in [0, 2**30]", 0 <= value[k] <= 2**30) for k in ZERO_OK]
    batch = args.num_envs * args.num_steps
    hint = "it holds no run to go on from"
    if os.path.isfile(f"{args.run_dir}/checkpoint.pt"):
        hint = f"to go on: --resume {args.run_dir}"
    rules += [  # a minibatch needs 2 rows: 1 has no spread to normalize by
        ("num_minibatches", f"a divisor of {batch} up to {batch // 2}",
         batch % max(1, args.num_minibatches) == 0 and batch >= 2 * args.num_minibatches),
        ("device", "auto, cpu or cuda (a GPU)",
         args.device in ["auto", "cpu"] or (args.device == "cuda" and torch.cuda.is_available())),
        ("env_id", "an ALE game (Pong, ALE/Pong-v5)", rom_id(args.env_id) is not None),
        ("resume", "left out with --eval", not (args.resume and args.eval)),
        ("gif", "given with --eval, in a folder that exists",
         not args.gif or (args.eval and os.path.isdir(os.path.dirname(args.gif) or "."))),
        ("run_dir", f"new or empty ({hint})", args.resume or args.eval or is_new(args.run_dir))]
    for name, must, ok in rules:  # the first rule broken ends it
        if not ok:
            parser.error(f"--{name.replace('_', '-')} must be {must} (--help lists every flag)")
    return args

def is_new(folder):  # an empty folder, or one not made yet (nor under a file)
    if os.path.isdir(folder):
        return not os.listdir(folder)
    return not os.path.exists(folder) and not os.path.isfile(os.path.dirname(folder))

def rom_id(env_id):
    """'breakout' for Breakout, BreakoutNoFrameskip-v4,
    ALE/Breakout-v5; None for no ALE game."""
    name = re.sub(r"(NoFrameskip|Deterministic)?(-v\d+)?$", "", env_id.split("/")[-1])
    ids = {rom.replace("_", ""): rom for rom in get_all_rom_ids()}  # mspacman: ms_pacman
    return ids.get(name.lower().replace("_", ""))

def pick_device(name, deterministic):
    # TF32 convolutions would put an update's first ratios (1 in
    # exact math) 1e-4 off; cuDNN's fast kernels vary run to run.
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.allow_tf32 = not deterministic
    auto = "cuda" if torch.cuda.is_available() else "cpu"  # the CNN: faster on a GPU
    return torch.device(auto if name == "auto" else name)

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
    bar, game scores and checkpoints. Ctrl-C or SIGTERM asks it
    to stop after the update; leaving the `with` block saves."""

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
        self.curve = ckpt.get("curve", [])  # each game's (step, score)
        self.bar = tqdm(total=total_steps, initial=ckpt.get("global_step", 0), unit="step")
        self.score = np.zeros(args.num_envs)  # each game's so far, unclipped
        self.length = np.zeros(args.num_envs, int)
        self.frames = np.zeros(args.num_envs, int)
        self.state = {}  # what the checkpoint holds
        self.stop = 0  # the signal that asked to stop
        for s in [signal.SIGINT, signal.SIGTERM]:
            signal.signal(s, self.ask_to_stop)

    def ask_to_stop(self, signum, frame):
        self.stop = signum
        signal.signal(signum, signal.SIG_DFL)  # a second one ends it at once
        tqdm.write("stopping after this update, saving first (again: at once)")

    def episodes(self, global_step, reward, done, info):
        """Adds a step's rewards; logs the games ended. A done is a
        lost life or a game over; after a game over the env has
        reset, so its frame count has fallen: that tells the two apart."""
        self.score += reward
        self.length += 1
        ended = done & (info["episode_frame_number"] < self.frames)
        self.frames = info["episode_frame_number"].copy()
        for i in np.flatnonzero(ended):
            row = {"global_step": global_step, "wall_time": round(time.time() - self.start, 1)}
            self.write("episodes.csv", {**row, "return": self.score[i], "length": self.length[i]})
            self.curve.append((global_step, float(self.score[i])))
        self.score[ended] = self.length[ended] = 0

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
    """--eval: one game per env."""
    device = pick_device(args.device, args.torch_deterministic)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.eval_episodes, life_loss_info=False)  # whole games
    agent = Agent(envs, args).to(device, memory_format=torch.channels_last)
    agent.load_state_dict(load_checkpoint(args.eval)["model"])
    obs, _ = envs.reset(seed=args.seed)
    scores = np.zeros(envs.num_envs)
    over = np.zeros(envs.num_envs, bool)
    frames = []  # episode 0's, 3x as big
    while not over.all():  # each has a frame cap
        if args.gif and not over[0]:
            frames.append(obs[0, -1].repeat(3, 0).repeat(3, 1))
        x = torch.as_tensor(obs, device=device)
        action = agent.get_action_and_value(x, greedy=args.deterministic)[0]
        obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
        scores += reward * ~over  # games over score no more
        over |= term | trunc
    envs.close()
    if args.gif:  # 15 steps a second
        from PIL import Image
        first, *rest = [Image.fromarray(frame) for frame in frames]
        first.save(args.gif, "GIF", save_all=True, append_images=rest, duration=67, loop=0)
        print(f"wrote {args.gif}, the first game")
    print(f"{len(scores)} episodes: {scores.mean():.1f} +- {scores.std():.1f}")
    return scores

if __name__ == "__main__":
    args = parse_args()
    run = evaluate if args.eval else train
    run(args)
