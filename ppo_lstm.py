"""PPO with an LSTM policy, on a task a memoryless policy cannot solve: CartPole without velocities.

    python ppo_lstm.py                          # masked CartPole, 50k steps, under a minute
    python ppo_lstm.py --memory none            # the control: the same network without memory
    python ppo_lstm.py --eval runs/<run>/checkpoint.pt --gif cartpole.gif

The agent sees the cart's position and the pole's angle, not their velocities: an LSTM for the actor
and one for the critic remember what it saw. Tags: "The 37 Implementation Details of PPO" (Huang et
al., 2022). The state is zeroed where an episode starts, not at a rollout's start; the update
replays whole env sequences from the rollout's first states; a truncated episode bootstraps under
its own state. Left out: one LSTM for both (more runs forgot), CUDA graphs (slower), Box actions.
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

SCRIPT = "ppo_lstm"  # written into every checkpoint, so that a foreign file is recognised
FORMAT = 3  # the checkpoint's layout
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, and what a job scheduler sends


@dataclass
class Args:  # every flag: --help shows the comment after each field
    # experiment
    seed: int = 1  # seed of torch and of the envs
    device: str = "auto"  # auto (the CPU: faster for these small networks), cpu or cuda
    run_dir: str = ""  # the run's folder (empty: runs/<env>__ppo_lstm__<seed>__<unix time>)
    save_interval: float = 300.0  # seconds between checkpoints (one is also written at the end)
    resume: str = ""  # continue the run of this checkpoint, with the arguments saved in it
    eval: str = ""  # play --eval-episodes episodes with this checkpoint's policy, print the returns
    eval_episodes: int = 20  # episodes played by --eval
    deterministic: bool = False  # --eval takes the most likely action instead of sampling
    gif: str = ""  # --eval also writes the first episode to this GIF file
    # environment
    env_id: str = "CartPole-v1"  # gymnasium env with flat observations and Discrete actions
    mask: str = "1,3"  # observation indices hidden from the agent (CartPole's velocities), or none
    total_timesteps: int = 50_000  # environment steps of the run
    num_envs: int = 8  # envs stepped in parallel [core-1]
    # algorithm
    num_steps: int = 32  # steps per env per rollout: the length of the sequences the update replays
    learning_rate: float = 1e-3  # Adam's learning rate at the start
    num_minibatches: int = 1  # minibatches per epoch, each of whole env sequences [core-6, lstm-4]
    update_epochs: int = 8  # passes over each rollout
    clip_coef: float = 0.2  # clip range of the policy ratio and of the value [core-8, core-9]
    ent_coef: float = 0.0  # entropy bonus coefficient [core-10]
    memory: str = "lstm"  # lstm, or none: the control, the LSTMs' state zeroed before every step
    hidden_size: int = 64  # width of the encoder and of each LSTM
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
    choices = dict(device=["auto", "cpu", "cuda"], memory=["lstm", "none"])
    for f in fields(Args):
        kind = dict(action=argparse.BooleanOptionalAction) if f.type is bool else dict(type=f.type)
        parser.add_argument("--" + f.name.replace("_", "-"), **kind, choices=choices.get(f.name),
                            default=argparse.SUPPRESS, help=f"{helps[f.name]} ({f.default})")
    given = vars(parser.parse_args(argv))
    args = Args(**given)
    if args.resume or args.eval:  # the checkpoint's arguments, but for what is the caller's
        saved = load_checkpoint(args.resume or args.eval)["args"]
        own = {"resume", "device"}  # with --eval: also how to play
        own |= {"eval", "eval_episodes", "deterministic", "gif", "seed"} if args.eval else set()
        for name in given.keys() - own:
            if given[name] != saved.get(name):
                parser.error(f"--{name.replace('_', '-')} differs from the checkpoint")
        args = Args(**{**saved, **{name: given[name] for name in given.keys() & own}})
    sizes = [f.name for f in fields(Args) if f.type is int and f.name != "seed"]
    sizes += ["learning_rate", "clip_coef"]  # and the two floats that must be positive
    for name in [name for name in sizes if getattr(args, name) <= 0]:  # parser.error: exit 2
        parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.num_envs % args.num_minibatches:  # a minibatch holds whole env sequences [lstm-4]
        parser.error("--num-minibatches must divide --num-envs")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU is visible")
    if args.env_id not in gym.registry:
        parser.error(f"--env-id {args.env_id!r}: not a gymnasium env")
    env = gym.make(args.env_id)
    shape = env.observation_space.shape
    if len(shape) != 1 or not isinstance(env.action_space, gym.spaces.Discrete):
        parser.error("--env-id: needs flat observations, Discrete actions")
    if not set(args.mask.split(",")) <= {"none", *map(str, range(shape[0]))}:
        parser.error(f"--mask {args.mask}: none or indices below {shape[0]}")
    if args.gif and not args.eval:
        parser.error("--gif needs --eval")
    folder = args.run_dir or "runs"
    if not (args.eval or args.resume) and os.path.exists(f"{folder}/args.json"):
        parser.error(f"--run-dir {folder} has a run (--resume it)")
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
    if not args.eval and not os.access(folder, os.W_OK):
        parser.error(f"--run-dir {folder}: cannot be written")
    return args


def make_envs(args, num_envs):  # same-step autoreset: info["final_obs"] has an episode's last obs
    make = partial(gym.make, args.env_id, render_mode="rgb_array")  # drawn only for --gif
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


class Agent(nn.Module):  # an encoder, then an LSTM and a head each for actor and critic [core-13]
    def __init__(self, envs, args):
        super().__init__()
        obs_dim = envs.single_observation_space.shape[0]  # it sees the indices --mask does not name
        self.visible = [i for i in range(obs_dim) if str(i) not in args.mask.split(",")]
        self.obs_norm = RunningNorm(len(self.visible))  # [cont-6] saved with the model
        self.return_norm = RunningNorm()  # [cont-8] the reward scale: the critic's output scale
        width = args.hidden_size
        self.encoder = nn.Sequential(layer_init(nn.Linear(len(self.visible), width)), nn.Tanh())
        self.actor_lstm = nn.LSTM(width, width)
        self.critic_lstm = nn.LSTM(width, width)  # its own: one shared LSTM lost more runs
        for lstm in (self.actor_lstm, self.critic_lstm):  # [lstm-1] orthogonal weights, 0 biases
            for param in lstm.parameters():  # weight_ih, weight_hh, bias_ih, bias_hh
                init = nn.init.orthogonal_ if param.dim() == 2 else nn.init.zeros_
                init(param)
        self.memory = args.memory
        num_actions = envs.single_action_space.n
        self.actor = layer_init(nn.Linear(width, num_actions), std=0.01)  # nearly uniform at first
        self.critic = layer_init(nn.Linear(width, 1), std=1)

    def zero_states(self, num_envs):  # [lstm-2] the actor's and the critic's (h, c): zeros
        zeros = self.critic.weight.new_zeros(1, num_envs, self.critic.in_features)
        return [(zeros, zeros)] * 2

    def features(self, x):  # x (T, B, obs_dim) raw -> (T, B, hidden): masked, normalized, encoded
        return self.encoder(self.obs_norm(x[..., self.visible]))  # [cont-6, cont-7]

    def unroll(self, lstm, features, state, done):
        """One LSTM over features (T, B, hidden) from its state (h, c), each (1, B, hidden); done:
        (T, B), 1 where step t starts an episode. -> outputs (T * B, hidden), the state after."""
        if self.memory == "none":  # the control: every step from a zero state; states stay zero
            return lstm(features.flatten(0, 1)[None])[0][0], state
        # Cut time where any env starts an episode: only a stretch's first step can start one, so
        # zeroing the state there [lstm-3] and one call per stretch is exact, and faster per step.
        cuts = (done[1:].any(1).nonzero().flatten() + 1).tolist()  # where a stretch begins
        outputs = []
        for stretch, starts in zip(features.tensor_split(cuts), done[[0, *cuts]]):
            keep = (1.0 - starts).view(1, -1, 1)  # 0 for the envs whose episode starts
            out, state = lstm(stretch, (state[0] * keep, state[1] * keep))
            outputs.append(out)
        return torch.cat(outputs).flatten(0, 1), state

    @torch.no_grad()  # for the rollout only
    def get_value(self, x, state):
        """V(x) (B,), x (B, obs_dim) one step on from the critic's (h, c), which is not zeroed."""
        out, _ = self.critic_lstm(self.features(x[None]), state)
        return self.critic(out[0]).squeeze(-1)

    def get_action_and_value(self, x, states, done, action=None, greedy=False):
        """The action (sampled, unless given), its log-probability, the entropy, V(x), all (T * B,),
        and the states after x[-1]. states: the actor's and the critic's (h, c) before x[0]."""
        features = self.features(x)
        actor_out, actor_state = self.unroll(self.actor_lstm, features, states[0], done)
        critic_out, critic_state = self.unroll(self.critic_lstm, features, states[1], done)
        logits = self.actor(actor_out)
        dist = torch.distributions.Categorical(logits=logits, validate_args=False)
        if action is None:
            action = logits.argmax(-1) if greedy else dist.sample()
        value = self.critic(critic_out).squeeze(-1)
        return action, dist.log_prob(action), dist.entropy(), value, (actor_state, critic_state)


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
    """One gradient step on the env sequences mb, replayed whole from the rollout's initial states
    [lstm-4, lstm-5]; rows flattened to (num_steps * len(mb),). The loss and its stats."""
    obs, dones, states, *rows = batch  # (num_steps, num_envs, ...); states: (h, c) pairs
    states = [(h[:, mb], c[:, mb]) for h, c in states]  # each (1, len(mb), hidden)
    actions, logprobs, advantages, returns, values = [x[:, mb].flatten(0, 1) for x in rows]
    _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
        obs[:, mb], states, dones[:, mb], actions)
    if args.norm_adv:  # [core-7]
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    loss, stats = ppo_loss(newlogprob, logprobs, advantages, newvalue, values, returns, entropy,
                           clip_coef, args.vf_coef, args.ent_coef, args.clip_vloss)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)  # [core-11]
    optimizer.step()
    return loss.detach(), stats


def train(args):
    # ---------------------------------------------------------------- 1. setup
    batch_size = args.num_envs * args.num_steps
    num_iterations = math.ceil(args.total_timesteps / batch_size)
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.num_envs)
    agent = Agent(envs, args).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)  # [core-3]
    iteration = 0  # updates done
    if args.resume:
        ckpt = load_checkpoint(args.resume)
        agent.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    path, logs = open_run(args, global_step)

    on_device = partial(torch.as_tensor, dtype=torch.float32, device=device)
    next_obs = on_device(envs.reset(seed=args.seed + iteration * args.num_envs)[0])  # new on resume
    next_done = torch.zeros(args.num_envs, device=device)
    # [lstm-2] The states start at zero, once, and are carried across rollouts: an episode that
    # goes on past a rollout's end keeps its memory; only an episode start zeroes it (unroll).
    states = agent.zero_states(args.num_envs)  # the actor's (h, c), the critic's (h, c)
    discounted_return = np.zeros(args.num_envs)  # each episode's discounted return so far
    score = np.zeros(args.num_envs)  # each episode's unscaled return so far
    length = np.zeros(args.num_envs, dtype=int)
    policy = torch.no_grad()(agent.get_action_and_value)  # the rollout only acts: no gradient

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
            initial_states = states  # [lstm-5] the update replays from here (not changed in place)
            # ------------------------------------------------------------ 2. rollout
            rollout = []  # per step, the tuple appended below (all on the device)
            for step in range(args.num_steps):
                action, logprob, _, value, states = policy(next_obs[None], states, next_done[None])
                next_obs_np, reward, term, trunc, info = envs.step(action.cpu().numpy())
                ended = term | trunc  # next_obs_np starts a new episode there
                global_step += args.num_envs
                score += reward
                length += 1
                discounted_return = discounted_return * args.gamma + reward  # [cont-8]
                # Truncation is not termination: gamma * V(final obs) joins the reward GAE sees.
                bootstrap = trunc & ~term  # terminated wins when both are set
                final_value = torch.zeros_like(value)
                if bootstrap.any():  # V under the episode's own critic state
                    final_obs = on_device(np.stack(info["final_obs"][bootstrap]))
                    state = [s[:, bootstrap] for s in states[1]]  # the critic's, these envs'
                    final_value[bootstrap] = agent.get_value(final_obs, state)
                rollout.append((next_obs, next_done, action, logprob, value, on_device(reward),
                                on_device(discounted_return), args.gamma * final_value))
                discounted_return[ended] = 0  # after the append, which copied this step's
                next_obs = on_device(next_obs_np)
                next_done = on_device(ended)
                for i in np.flatnonzero(ended):
                    wall_time = round(time.time() - start, 1)
                    write_row(logs["episodes.csv"], [global_step, wall_time, score[i], length[i]])
                    bar.set_postfix(score=score[i])  # the last episode's return
                    score[i] = 0
                    length[i] = 0
            obs, dones, actions, logprobs, values, rewards, discounted, bootstraps = map(
                torch.stack, zip(*rollout))  # each (num_steps, num_envs, ...); obs raw
            # ------------------------------------------------------------ 3. advantages
            # [cont-8, cont-9] rewards / std of the discounted return (not centred), clipped to +-10
            agent.return_norm.update(discounted.reshape(-1))
            reward_scale = (agent.return_norm.var.float() + 1e-8).sqrt()
            gae_rewards = (rewards / reward_scale).clamp(-10, 10) + bootstraps
            next_value = agent.get_value(next_obs, states[1])  # GAE ignores it at an episode start
            advantages, returns = compute_gae(gae_rewards, values, dones, next_value, next_done,
                                              args.gamma, args.gae_lambda)
            # ------------------------------------------------------------ 4. update
            batch = (obs, dones, initial_states, actions, logprobs, advantages, returns, values)
            all_stats = []  # per minibatch: the loss, ppo_loss's stats; one wait for the device
            for epoch in range(args.update_epochs):  # [lstm-4] a minibatch: whole env sequences
                for mb in torch.randperm(args.num_envs, device=device).chunk(args.num_minibatches):
                    loss, stats = minibatch_step(agent, optimizer, args, batch, args.clip_coef, mb)
                    all_stats.append(torch.stack([loss, *stats.values()]))
                if args.target_kl is not None and stats["approx_kl"] > args.target_kl:  # [aux-3]
                    break
            means = dict(zip(["loss", *stats], torch.stack(all_stats).mean(0).tolist()))
            if not math.isfinite(means["loss"]):
                broken = f"non-finite loss in update {iteration + 1} (global step {global_step})"
                break
            iteration += 1
            # [cont-6] Moved between updates only: an update sees the normalization its rollout saw.
            agent.obs_norm.update(obs.flatten(0, 1)[:, agent.visible])
            # ------------------------------------------------------------ 5. logging
            sps = batch_size / (time.time() - iteration_start)
            row = dict(global_step=global_step, sps=sps, learning_rate=lr, clip_coef=args.clip_coef)
            row |= means
            # explained variance: 1 for a perfect critic, 0 a mean (-inf or nan: constant returns)
            unexplained = (returns - values).var() / returns.var()
            row["explained_variance"] = 1 - unexplained.item()
            write_row(logs["updates.csv"], [row[k] for k in HEADERS["updates.csv"].split(",")])
            bar.update(batch_size)
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
        sys.exit(f"error: checkpoint {path}: unreadable ({type(e).__name__})")
    if not isinstance(ckpt, dict) or ckpt.get("script") != SCRIPT or ckpt.get("format") != FORMAT:
        sys.exit(f"error: checkpoint {path}: not {SCRIPT}.py's, format {FORMAT}")
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
    with open(f"{args.run_dir}/args.json", "w") as f:
        json.dump(asdict(args), f, indent=2)
    path = {n: f"{args.run_dir}/{n}" for n in [*HEADERS, "curve.png", "checkpoint.pt"]}
    logs = {}
    for name, header in HEADERS.items():
        resumed = global_step and os.path.exists(path[name])
        rows = open(path[name]).read().split()[1:] if resumed else []
        kept = [row for row in rows if float(row.split(",")[0]) <= global_step]  # float: 1e+06 too
        logs[name] = open(path[name], "w")
        logs[name].write("\n".join([header, *kept]) + "\n")
    return path, logs


def write_row(log, values):
    """One row of a CSV log: numbers to 6 significant digits, whole numbers whole."""
    log.write(",".join(str(x) if isinstance(x, int) else f"{x:.6g}" for x in values) + "\n")


@torch.no_grad()  # it only acts
def evaluate(args):
    """Play --eval-episodes episodes, one per env, from zero states [lstm-2]; print the returns."""
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.eval_episodes)
    agent = Agent(envs, args).to(device)
    agent.load_state_dict(load_checkpoint(args.eval)["model"])  # the training's normalization too
    obs, _ = envs.reset(seed=args.seed)
    states = agent.zero_states(args.eval_episodes)
    done = torch.zeros(1, args.eval_episodes, device=device)  # no reset: later episodes don't count
    scores = np.zeros(args.eval_episodes)
    over = np.zeros(args.eval_episodes, bool)
    frames = []  # episode 0's frames, for --gif
    while not over.all():  # every episode ends, by itself or at its step limit
        if args.gif and not over[0]:
            frames.append(envs.envs[0].render())  # from the env's own camera
        x = torch.as_tensor(obs[None], device=device)  # (1, N, obs_dim)
        action, *_, states = agent.get_action_and_value(x, states, done, greedy=args.deterministic)
        obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
        scores += reward * ~over
        over |= term | trunc
    envs.close()
    if args.gif:
        from PIL import Image
        images = [Image.fromarray(frame).reduce(2) for frame in frames]  # 25 steps a second
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
