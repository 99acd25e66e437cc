"""PPO with an LSTM policy, on tasks a memoryless policy cannot solve: CartPole with its velocities hidden.

    python ppo_lstm.py                                   # masked CartPole, 50k steps, about 12 s on a CPU
    python ppo_lstm.py --memory none                     # the control: the same network without memory
    python ppo_lstm.py --env-id Pendulum-v1 --total-timesteps 300000   # angular velocity hidden, Box actions
    python ppo_lstm.py --eval runs/<run>/checkpoint.pt --gif cartpole.gif

The agent sees the cart's position and the pole's angle, not their velocities: after a small encoder, an
LSTM for the actor and one for the critic remember what it saw. Implements, tagged by the numbering of "The 37
Implementation Details of PPO" (Huang et al., 2022): core-1..13, lstm-1..5, aux-3, cont-1..3 and cont-5 (Box
actions), cont-6..9 (observation normalization, reward scaling: masked CartPole learns far slower without).
Where recurrent PPO has gone wrong (FACTS.md): the state is zeroed where an episode starts, never at a rollout
boundary; the update replays whole env sequences from the rollout's initial state and recomputes exactly the
log-probabilities the rollout stored (tests/test_lstm.py); truncation bootstraps under the episode's state.
"""
import argparse
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, fields

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical, Independent, Normal
from tqdm import tqdm

SCRIPT, FORMAT = "ppo_lstm", 2  # written into every checkpoint, so that a foreign file is recognised
MASKS = {"CartPole-v1": "1,3", "Pendulum-v1": "2"}  # the velocities: cart and pole; angular velocity


def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    # experiment
    seed: int = arg(1, "seed of torch and of the envs")
    torch_deterministic: bool = arg(True, "make cuDNN deterministic (same seed, same run)")
    device: str = arg("auto", "auto | cpu | cuda (auto takes CUDA when present)")
    run_dir: str = arg("", "the run's folder (default runs/<env>__ppo_lstm__<seed>__<unix time>)")
    save_interval: float = arg(300.0, "seconds between checkpoints (one is also written at the end)")
    resume: str = arg("", "continue the run of this checkpoint, with its arguments")
    eval: str = arg("", "play --eval-episodes episodes with this checkpoint's policy and print the returns")
    eval_episodes: int = arg(20, "episodes played by --eval")
    deterministic: bool = arg(False, "--eval takes the most likely action (the mean) instead of sampling")
    gif: str = arg("", "--eval also writes the first episode to this GIF file")
    # environment
    env_id: str = arg("CartPole-v1", "gymnasium env id, Discrete or Box actions")
    mask: str = arg("", "observation indices hidden from the agent (1,3), none, or empty: the env's MASKS")
    total_timesteps: int = arg(50_000, "environment steps of the run")
    num_envs: int = arg(8, "envs stepped in parallel [core-1]")
    # algorithm
    memory: str = arg("lstm", "lstm | none (the control: the LSTMs' state zeroed before every step)")
    hidden_size: int = arg(64, "width of the encoder and of each LSTM")
    num_steps: int = arg(32, "steps per env per rollout: the length of the sequences the update replays")
    learning_rate: float = arg(1e-3, "Adam learning rate")
    anneal_lr: bool = arg(True, "anneal the learning rate linearly to 0 [core-4]")
    gamma: float = arg(0.99, "discount factor")
    gae_lambda: float = arg(0.95, "GAE lambda [core-5]")
    num_minibatches: int = arg(1, "minibatches per epoch, each of whole env sequences [core-6, lstm-4]")
    update_epochs: int = arg(8, "passes over each rollout")
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
    args.mask = args.mask or MASKS.get(args.env_id, "none")  # written out, so args.json says what was hidden
    env, hidden = gym.make(args.env_id), [int(i) for i in args.mask.split(",") if i.isdigit()]
    obs_dim = env.observation_space.shape[0] if len(env.observation_space.shape) == 1 else 0
    positive = ["total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs",
                "learning_rate", "clip_coef", "hidden_size", "eval_episodes"]
    checks = [(getattr(args, k) > 0, f"--{k.replace('_', '-')} must be positive") for k in positive] + [
        (args.num_envs % max(args.num_minibatches, 1) == 0, "--num-minibatches must divide --num-envs"),
        (0 <= args.gamma <= 1 and 0 <= args.gae_lambda <= 1, "--gamma and --gae-lambda must lie in [0, 1]"),
        (args.device in ("auto", "cpu", "cuda"), "--device must be auto, cpu or cuda"),
        (args.device != "cuda" or torch.cuda.is_available(), "--device cuda: no CUDA GPU is visible"),
        (args.memory in ("lstm", "none"), "--memory must be lstm or none"),
        (isinstance(env.action_space, (gym.spaces.Discrete, gym.spaces.Box)) and obs_dim > 0,
         f"--env-id {args.env_id}: needs flat Box observations and Discrete or Box actions"),
        (args.mask == "none" or len(hidden) == args.mask.count(",") + 1, "--mask: none, or indices like 1,3"),
        (all(0 <= i < obs_dim for i in hidden) and len(set(hidden)) < max(obs_dim, 1),
         f"--mask must name indices in 0..{obs_dim - 1} and leave one visible")]
    for ok, message in checks:
        if not ok:
            p.error(message)
    return args


def make_envs(args, num_envs):
    """SAME_STEP autoreset: every stored transition is real, the final observation is in info (SPEC.md)."""
    limit = gym.spec(args.env_id).max_episode_steps or 1000  # every episode ends, in training and in --eval
    make = lambda: gym.make(args.env_id, max_episode_steps=limit, render_mode="rgb_array")  # renders if asked
    envs = gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    # [cont-5] a Box action is clipped to the bounds on its way to the envs; the unclipped sample is stored
    box = isinstance(envs.single_action_space, gym.spaces.Box)
    return gym.wrappers.vector.ClipAction(envs) if box else envs


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)  # [core-2] orthogonal weights, constant bias
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class RunningNorm(nn.Module):
    """Mean and variance of all batches so far (Chan et al.'s update), in buffers saved with the weights."""

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


class Agent(nn.Module):
    """Encoder -> two LSTMs, the actor's and the critic's [core-13] -> the actor and the critic heads."""

    def __init__(self, obs_dim, args, action_space):
        super().__init__()
        visible = [i for i in range(obs_dim) if str(i) not in args.mask.split(",")]  # mask: "1,3" or "none"
        self.register_buffer("visible", torch.tensor(visible))
        self.obs_norm = RunningNorm(len(self.visible))  # [cont-6] the policy's input scale, saved with it
        self.return_norm = RunningNorm()  # [cont-8] the reward scale, that is the critic's output scale
        self.encoder = nn.Sequential(layer_init(nn.Linear(len(self.visible), args.hidden_size)), nn.Tanh())
        # The critic has its own memory: with one LSTM for both, more runs lost what they learned (README.md)
        self.lstms = nn.ModuleList(nn.LSTM(args.hidden_size, args.hidden_size) for _ in range(2))
        for name, param in self.lstms.named_parameters():  # [lstm-1] orthogonal weights, zero biases
            nn.init.orthogonal_(param, 1.0) if "weight" in name else nn.init.constant_(param, 0.0)
        self.continuous, self.memory = isinstance(action_space, gym.spaces.Box), args.memory
        num_outputs = action_space.shape[0] if self.continuous else action_space.n
        self.actor = layer_init(nn.Linear(args.hidden_size, num_outputs), std=0.01)
        self.critic = layer_init(nn.Linear(args.hidden_size, 1), std=1)
        self.actor_logstd = nn.Parameter(torch.zeros(num_outputs)) if self.continuous else None  # [cont-2]

    def get_states(self, x, state, done):
        """x: (T, B, obs_dim) raw observations; done: (T, B), 1 where x[t] starts an episode; state (h, c)
        before x[0], each (2, B, hidden) -> (actor, critic) features (T * B, hidden), the state after x[-1]"""
        hidden = self.encoder(self.obs_norm(x[..., self.visible]))  # visible, normalized [cont-6, cont-7]
        if self.memory == "none":  # the control: zeroed before every step, the LSTMs are feed-forward layers
            return [lstm(hidden.flatten(0, 1)[None])[0][0] for lstm in self.lstms], state
        # Cut time where any episode starts: in each stretch only the first step can start one, so zeroing
        # the state there [lstm-3] and one LSTM call per stretch is exact, and faster than a loop over steps.
        cuts = [0] + (done[1:].any(1).nonzero().flatten() + 1).tolist() + [len(done)]
        (h, c), outputs = state, []
        for begin, end in zip(cuts[:-1], cuts[1:]):
            h, c = (s * (1.0 - done[begin]).view(1, -1, 1) for s in (h, c))
            runs = [lstm(hidden[begin:end], (h[i, None], c[i, None])) for i, lstm in enumerate(self.lstms)]
            outputs.append(torch.cat([out for out, _ in runs], -1))  # (end - begin, B, 2 * hidden)
            h, c = (torch.cat(parts) for parts in zip(*[s for _, s in runs]))
        return torch.cat(outputs).flatten(0, 1).chunk(2, -1), (h, c)

    def get_action_and_value(self, x, state, done, action=None, greedy=False):
        (hidden, critic_hidden), state = self.get_states(x, state, done)
        out = self.actor(hidden)
        if self.continuous:  # [cont-1, cont-3] a Normal per action dimension, log-probabilities summed
            dist = Independent(Normal(out, self.actor_logstd.exp().expand_as(out), validate_args=False), 1)
        else:
            dist = Categorical(logits=out, validate_args=False)
        if action is None:
            action = dist.mode if greedy else dist.sample()  # mode: the mean, or the likeliest action
        return action, dist.log_prob(action), dist.entropy(), self.critic(critic_hidden).squeeze(-1), state


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
    """Play --eval-episodes episodes, one per env, the LSTM state carried through each; report the returns."""
    ckpt, device = load_checkpoint(args.eval), pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.eval_episodes)
    agent = Agent(envs.single_observation_space.shape[0], args, envs.single_action_space).to(device)
    agent.load_state_dict(ckpt["model"])  # the weights and the observation statistics of training
    obs, _ = envs.reset(seed=args.seed)
    state = (torch.zeros(2, args.eval_episodes, args.hidden_size, device=device),) * 2  # [lstm-2]
    done = torch.ones(args.eval_episodes, device=device)  # the first step starts an episode
    returns, finished, frames = np.zeros(args.eval_episodes), np.zeros(args.eval_episodes, bool), []
    while not finished.all():  # every episode ends, by itself or at the env's step limit
        if args.gif and not finished[0]:
            frames.append(envs.unwrapped.envs[0].render())
        with torch.no_grad():
            x = as_tensor(obs, device)[None]  # a sequence of one step: (1, num_envs, obs_dim)
            action, *_, state = agent.get_action_and_value(x, state, done[None], greedy=args.deterministic)
        obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
        returns += reward * ~finished
        finished |= term | trunc
        done = torch.as_tensor(term | trunc, dtype=torch.float32, device=device)  # a new episode: zero state
    envs.close()
    if args.gif:
        from PIL import Image
        images = [Image.fromarray(f).resize((f.shape[1] // 2, f.shape[0] // 2)) for f in frames]
        images[0].save(args.gif, save_all=True, append_images=images[1:], duration=40, loop=0)  # 25 steps/s
    print(f"eval {args.env_id}, {args.eval_episodes} episodes: {returns.mean():.1f} +- {returns.std():.1f}")
    return returns


def train(args):
    # ---------------------------------------------------------------- 1. setup
    batch_size = args.num_envs * args.num_steps
    envs_per_minibatch = args.num_envs // args.num_minibatches  # [lstm-4] minibatches of whole sequences
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
    agent = Agent(envs.single_observation_space.shape[0], args, envs.single_action_space).to(device)
    discounted_return = np.zeros(args.num_envs)  # for reward scaling [cont-8]
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

    # Rollout storage, on the device; raw observations, which the agent masks and normalizes itself.
    obs = torch.zeros((args.num_steps, args.num_envs, envs.single_observation_space.shape[0]), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape, device=device,
                          dtype=torch.float32 if agent.continuous else torch.long)
    logprobs, rewards, dones, values = (torch.zeros((args.num_steps, args.num_envs), device=device)
                                        for _ in range(4))  # each (num_steps, num_envs) float32
    next_obs_np, _ = envs.reset(seed=args.seed + iteration * args.num_envs)
    next_obs = as_tensor(next_obs_np, device)  # (num_envs, obs_dim)
    next_done = torch.zeros(args.num_envs, device=device)
    # [lstm-2] the state starts at zero, once. It is carried across rollouts: an episode that goes on past a
    # rollout's end must keep its memory, so only an episode start zeroes it (inside get_states).
    lstm_state = (torch.zeros(2, args.num_envs, args.hidden_size, device=device),) * 2  # (h, c): get_states
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
            initial_state = tuple(s.clone() for s in lstm_state)  # [lstm-5] the update replays from here

            # ------------------------------------------------------------ 2. rollout
            for step in range(args.num_steps):
                t0 = time.perf_counter()
                obs[step], dones[step] = next_obs, next_done
                with torch.no_grad():
                    action, logprob, _, value, lstm_state = agent.get_action_and_value(
                        next_obs[None], lstm_state, next_done[None])  # a sequence of one step
                actions[step], logprobs[step], values[step] = action, logprob, value
                action_np = action.cpu().numpy()  # the step's one wait on the device: the envs need it
                t1 = time.perf_counter()
                next_obs_np, reward, term, trunc, info = envs.step(action_np)
                global_step += args.num_envs
                episode_return, episode_length = episode_return + reward, episode_length + 1
                # [cont-8, cont-9] scale by the std of the discounted return so far (its mean is not removed)
                discounted_return = discounted_return * args.gamma + reward
                agent.return_norm.update(discounted_return)
                reward = np.clip(reward / (agent.return_norm.var.item() + 1e-8) ** 0.5, -10, 10)
                discounted_return[term | trunc] = 0
                # Truncation is not termination: add gamma * V(final observation), under the episode's own
                # state, after the reward scaling. When both are set, terminated wins.
                bootstrap = trunc & ~term
                if bootstrap.any():
                    final_obs = as_tensor(np.stack(info["final_obs"][bootstrap]), device)[None]  # (1, k, obs)
                    state = tuple(s[:, bootstrap] for s in lstm_state)  # one more step of their own memory,
                    no_reset = torch.zeros(final_obs.shape[:2], device=device)  # within the same episode
                    with torch.no_grad():
                        final_value = agent.get_action_and_value(final_obs, state, no_reset)[3]
                    reward[bootstrap] += args.gamma * final_value.cpu().numpy()
                rewards[step] = as_tensor(reward, device)
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
            with torch.no_grad():
                next_value = agent.get_action_and_value(next_obs[None], lstm_state, next_done[None])[3]
                advantages, returns = compute_gae(rewards, values, dones, next_value, next_done,
                                                  args.gamma, args.gae_lambda)

            # ------------------------------------------------------------ 4. update
            # [lstm-4, lstm-5] minibatches of whole env sequences, replayed from the rollout's initial state
            all_stats = []
            for epoch in range(args.update_epochs):
                env_perm = torch.randperm(args.num_envs, device=device)
                for begin in range(0, args.num_envs, envs_per_minibatch):
                    mb_envs = env_perm[begin:begin + envs_per_minibatch]
                    mb = lambda x: x[:, mb_envs].flatten(0, 1)  # (num_steps, num_envs, ...) -> (mb size, ...)
                    _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
                        obs[:, mb_envs], tuple(s[:, mb_envs] for s in initial_state), dones[:, mb_envs],
                        mb(actions))
                    mb_advantages = mb(advantages)
                    if args.norm_adv:  # [core-7]
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    loss, stats = ppo_loss(newlogprob, mb(logprobs), mb_advantages, newvalue, mb(values),
                                           mb(returns), entropy, args.clip_coef, args.vf_coef, args.ent_coef,
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

            # [cont-6] the observation statistics move between updates only: a rollout and the update after it
            # see one normalization, so the update recomputes exactly what the rollout stored.
            agent.obs_norm.update(obs.flatten(0, 1)[:, agent.visible])

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
