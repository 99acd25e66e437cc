"""PPO with evolved hyperparameters: a population of agents trains, is scored, and the fittest are copied.

    python ppo_evolve.py                 # CartPole, 6 members, until one scores 475 (<= 600k steps, < 1 min)
    python ppo_evolve.py --no-evolve     # the control: the same population and budget, never selected
    python ppo_evolve.py --total-timesteps 30000 --evo-steps 2048   # a tiny budget, seconds
    python ppo_evolve.py --eval runs/<run>/checkpoint.pt --gif best.gif   # plays the fittest member

Evolutionary hyperparameter optimization as AgileRL offers it for PPO. Each member is an MLP actor-critic with
its own learning rate, entropy coefficient, clip range and GAE lambda (HPARAMS). A generation: each member
trains --evo-steps env steps with the PPO blocks of the other scripts, then plays --eval-episodes episodes,
whose mean return is its fitness. The fittest goes on unchanged (elitism); each other slot gets a copy of a
tournament's winner, Adam state included, mutated once. Steps count the whole population, evaluation steps
apart. Tags ("The 37 Implementation Details of PPO", Huang et al., 2022): core-1..13 (core-4 is --anneal-lr,
off by default: the rate evolves), aux-3, cont-1..5. Left out: observation and reward normalization
(cont-6..9): each member would need its own running statistics, copied with it; CartPole learns without.
"""
import argparse
import copy
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

SCRIPT, FORMAT = "ppo_evolve", 1  # written into every checkpoint, so that a foreign file is recognised
# Evolved hyperparameters (low, high): first drawn log-uniformly, never mutated out. Wide: some are bad.
HPARAMS = dict(learning_rate=(1e-5, 1e-2), ent_coef=(1e-4, 0.1), clip_coef=(0.05, 0.5), gae_lambda=(0.8, 1.0))
MUTATIONS = ("none", "hparam", "weights", "arch")  # a copy gets one, drawn with the odds of the --mut-* flags


def arg(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Args:
    # experiment
    seed: int = arg(1, "seed of torch, of the envs and of the evolution")
    torch_deterministic: bool = arg(True, "make cuDNN deterministic (same seed, same run)")
    device: str = arg("auto", "auto | cpu | cuda (auto takes CUDA when present)")
    run_dir: str = arg("", "the run's folder (default runs/<env>__ppo_evolve__<seed>__<unix time>)")
    resume: str = arg("", "continue the run of this checkpoint, with its arguments")
    eval: str = arg("", "play --eval-episodes episodes with the checkpoint's fittest member")
    eval_episodes: int = arg(10, "episodes (one per env) that score a member, and that --eval plays")
    deterministic: bool = arg(False, "--eval takes the most likely action (the mean) instead of sampling")
    gif: str = arg("", "--eval also writes the first episode to this GIF file")
    # environment
    env_id: str = arg("CartPole-v1", "gymnasium env id, Discrete or Box actions")
    total_timesteps: int = arg(600_000, "environment steps of the run, all members together")
    num_envs: int = arg(8, "envs stepped in parallel [core-1]")
    # evolution
    pop_size: int = arg(6, "members of the population")
    evo_steps: int = arg(10_240, "training steps of each member in a generation (whole rollouts)")
    tournament_size: int = arg(2, "members drawn for each tournament; the fittest of them is copied")
    evolve: bool = arg(True, "select and mutate; --no-evolve: random search, the control")
    target: float = arg(None, "stop once the best fitness reaches this; None: the env's reward_threshold")
    mut_none: float = arg(0.2, "weight of 'no mutation' for a copied member")
    mut_hparam: float = arg(0.4, "weight of 'one hyperparameter x0.8 or x1.2, within HPARAMS'")
    mut_weights: float = arg(0.2, "weight of 'Gaussian noise on the weights'")
    mut_arch: float = arg(0.2, "weight of 'a hidden layer widened, narrowed or added'")
    # algorithm (learning rate, entropy coefficient, clip range and GAE lambda are evolved: HPARAMS)
    hidden_size: int = arg(64, "width of the two hidden layers every member starts with")
    num_steps: int = arg(128, "steps per env per rollout")
    anneal_lr: bool = arg(False, "x each member's lr by the share of the run left [core-4]; off: lr evolves")
    gamma: float = arg(0.99, "discount factor")
    num_minibatches: int = arg(4, "minibatches per epoch [core-6]")
    update_epochs: int = arg(4, "passes over each rollout")
    norm_adv: bool = arg(True, "normalize advantages per minibatch [core-7]")
    clip_vloss: bool = arg(True, "clip the value loss [core-9]")
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
    env, weights = gym.make(args.env_id), [getattr(args, "mut_" + k) for k in MUTATIONS]
    positive = [f.name for f in fields(Args) if f.type is int and f.name != "seed"]  # the sizes and counts
    checks = [(getattr(args, k) > 0, f"--{k.replace('_', '-')} must be positive") for k in positive] + [
        (args.num_envs * args.num_steps % max(args.num_minibatches, 1) == 0, "--num-minibatches must divide "
         "--num-envs x --num-steps"),
        (0 <= args.gamma <= 1, "--gamma must lie in [0, 1]"),
        (args.device in ("auto", "cpu") or args.device == "cuda" and torch.cuda.is_available(),
         "--device must be auto, cpu or cuda (cuda: with a CUDA GPU visible)"),
        (isinstance(env.action_space, (gym.spaces.Discrete, gym.spaces.Box))
         and len(env.observation_space.shape or ()) == 1,
         f"--env-id {args.env_id}: needs flat Box observations and Discrete or Box actions"),
        (min(weights) >= 0 < sum(weights), "--mut-none, -hparam, -weights, -arch: >= 0, not all 0")]
    for ok, message in checks:
        if not ok:
            p.error(message)
    return args


def make_envs(args, num_envs, render=False):
    """SAME_STEP autoreset (every stored transition is real, SPEC.md), a cap on every episode; render: GIF."""
    limit = gym.spec(args.env_id).max_episode_steps or 1000
    make = lambda: gym.make(args.env_id, max_episode_steps=limit, render_mode="rgb_array" if render else None)
    envs = gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)  # info["episode"]: return and length at the end
    box = isinstance(envs.single_action_space, gym.spaces.Box)
    return gym.wrappers.vector.ClipAction(envs) if box else envs  # [cont-5] clipped for the envs only


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)  # [core-2] orthogonal weights, constant bias
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim, hidden, out_dim, std):
    """A tanh MLP body and its head, apart: the head's parameter names stay when a layer is added."""
    layers = [m for a, b in zip([in_dim, *hidden], hidden) for m in (layer_init(nn.Linear(a, b)), nn.Tanh())]
    return nn.Sequential(*layers), layer_init(nn.Linear(hidden[-1], out_dim), std=std)


class Agent(nn.Module):
    """Separate actor and critic MLPs [core-13, cont-4] with the same hidden widths (a list, evolved)."""

    def __init__(self, obs_dim, hidden, action_space):
        super().__init__()
        self.continuous = isinstance(action_space, gym.spaces.Box)
        num_outputs = action_space.shape[0] if self.continuous else action_space.n
        self.critic_body, self.critic_head = mlp(obs_dim, hidden, 1, std=1.0)
        self.actor_body, self.actor_head = mlp(obs_dim, hidden, num_outputs, std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(num_outputs)) if self.continuous else None  # [cont-2]

    def get_value(self, x):
        return self.critic_head(self.critic_body(x)).squeeze(-1)

    def get_action_and_value(self, x, action=None, greedy=False):
        out = self.actor_head(self.actor_body(x))
        if self.continuous:  # [cont-1, cont-3] a Normal per action dimension, log-probabilities summed
            dist = Independent(Normal(out, self.actor_logstd.exp().expand_as(out), validate_args=False), 1)
        else:
            dist = Categorical(logits=out, validate_args=False)
        if action is None:
            action = dist.mode if greedy else dist.sample()  # mode: the mean, or the likeliest action
        return action, dist.log_prob(action), dist.entropy(), self.get_value(x)


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


# -------------------------------------------------------------------------------- the population
# A member is plain data, what the checkpoint holds: id (generation * pop_size + slot), parent (-1 at first),
# mutation, fitness (-inf until scored), hidden (widths), hparams, model and adam (state dicts, on the CPU).
def build(member, obs_dim, action_space, device):
    """The member's network and optimizer. Not optimizer.load_state_dict: it would also bring back the
    learning rate saved with the state, for a copy its parent's (FACTS.md). The member's own rate is used."""
    agent = Agent(obs_dim, member["hidden"], action_space).to(device)
    agent.load_state_dict(member["model"])
    optimizer = torch.optim.Adam(agent.parameters(), member["hparams"]["learning_rate"], eps=1e-5)  # [core-3]
    for name, p in agent.named_parameters():  # a tensor whose shape changed starts afresh; "step" on the CPU
        if (saved := member["adam"].get(name)) is not None and saved["exp_avg"].shape == p.shape:
            optimizer.state[p] = {k: v.to(device if v.dim() else "cpu", copy=True) for k, v in saved.items()}
    return agent, optimizer


def next_generation(population, generation, args, obs_dim, action_space):
    """Elitism: the fittest goes on as it is. Each other slot: a copy of the winner of a tournament (entrants
    drawn with replacement), mutated once."""
    rng = np.random.default_rng([args.seed, generation])  # a function of the generation: resume restores it
    odds, children = np.array([getattr(args, "mut_" + k) for k in MUTATIONS]), []
    for slot in range(1, args.pop_size):
        parent = max(rng.choice(population, args.tournament_size), key=lambda m: m["fitness"])
        child = dict(copy.deepcopy(parent), id=generation * args.pop_size + slot, parent=parent["id"],
                     fitness=-np.inf, mutation=str(rng.choice(MUTATIONS, p=odds / odds.sum())))
        if child["mutation"] == "hparam":  # one hyperparameter x0.8 or x1.2, kept within its range
            k = child["mutation"] = str(rng.choice(list(HPARAMS)))
            child["hparams"][k] = float(np.clip(child["hparams"][k] * rng.choice([0.8, 1.2]), *HPARAMS[k]))
        elif child["mutation"] == "weights":  # noise on each weight matrix: 0.1 of the spread of its weights
            g = torch.Generator().manual_seed(int(rng.integers(2**31)))
            for w in (w for w in child["model"].values() if w.dim() == 2):
                w += torch.randn(w.shape, generator=g) * 0.1 * w.std()
        elif child["mutation"] == "arch":
            hidden, i = child["hidden"], int(rng.integers(len(child["hidden"])))
            if len(hidden) < 3 and rng.random() < 1 / 3:
                hidden.append(hidden[-1])  # a layer added at the end, as wide as the last one: fresh weights
            else:  # one layer 16 units wider or narrower, 16 to 256
                hidden[i] = int(np.clip(hidden[i] + rng.choice([-16, 16]), 16, 256))
            old, child["model"] = child["model"], Agent(obs_dim, hidden, action_space).state_dict()
            for name, p in child["model"].items():  # the old weights where they fit; a widened layer's new
                if name in old:  # units are read with weights 0, so the network computes what it did before
                    fit = tuple(slice(0, min(a, b)) for a, b in zip(p.shape, old[name].shape))
                    p[fit] = old[name][fit]
                    p[..., old[name].shape[-1]:] = 0  # new inputs of a weight matrix (a new bias is 0 anyway)
        children.append(child)
    return [max(population, key=lambda m: m["fitness"])] + children  # the elite first


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


def plot_population(csv_path, png_path, title):
    """The fitness of every member in every generation, and where each hyperparameter went."""
    import matplotlib.pyplot as plt  # plot_curve, called just before, chose the file-only backend
    data = np.atleast_1d(np.genfromtxt(csv_path, delimiter=",", names=True, dtype=None, encoding=None))
    fig, axes = plt.subplots(1, 1 + len(HPARAMS), figsize=(4 * (1 + len(HPARAMS)), 3.5))
    for ax, name in zip(axes, ["fitness", *HPARAMS]):
        ax.scatter(data["generation"], data[name], c=data["fitness"], s=12)
        ax.set(xlabel="generation", title=name, yscale="log" if name in HPARAMS else "linear")
    fig.suptitle(f"{title} (colour: fitness)", y=1.03)
    fig.savefig(png_path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def pick_device(name):
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def as_tensor(x, device):
    return torch.as_tensor(x, dtype=torch.float32, device=device)


def play(agent, envs, seed, device, greedy=False, frames=None):
    """One episode per env (greedy: the likeliest actions) -> returns, lengths; frames gets env 0's images."""
    obs, _ = envs.reset(seed=seed)
    returns, lengths, ended = *np.zeros((2, envs.num_envs)), np.zeros(envs.num_envs, bool)  # each (num_envs,)
    while not ended.all():  # every episode ends, by itself or at the env's step limit
        if frames is not None and not ended[0]:
            frames.append(envs.unwrapped.envs[0].render())  # unwrapped: under the vector wrappers
        with torch.no_grad():
            action = agent.get_action_and_value(as_tensor(obs, device), greedy=greedy)[0]
        obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
        returns, lengths, ended = returns + reward * ~ended, lengths + ~ended, ended | term | trunc
    return returns, lengths


def evaluate(args):
    """Play --eval-episodes episodes, one per env, with the fittest member of the checkpoint."""
    ckpt, device = load_checkpoint(args.eval), pick_device(args.device)
    torch.manual_seed(args.seed)
    best, frames = max(ckpt["population"], key=lambda m: m["fitness"]), []
    envs = make_envs(args, args.eval_episodes, render=bool(args.gif))
    agent = build(best, envs.single_observation_space.shape[0], envs.single_action_space, device)[0]
    returns = play(agent, envs, args.seed, device, args.deterministic, frames if args.gif else None)[0]
    if args.gif:
        from PIL import Image
        images = [Image.fromarray(f).resize((f.shape[1] // 2, f.shape[0] // 2)) for f in frames]
        images[0].save(args.gif, save_all=True, append_images=images[1:], duration=40, loop=0)  # 25 steps/s
    print(f"eval {args.env_id}, member {best['id']} (fitness {best['fitness']:.1f}), "
          f"{args.eval_episodes} episodes: {returns.mean():.1f} +- {returns.std():.1f}")


def train(args):
    # ---------------------------------------------------------------- 1. setup
    batch_size = args.num_envs * args.num_steps
    iterations = -(-args.evo_steps // batch_size)  # per member and generation: whole rollouts
    num_generations = -(-args.total_timesteps // (iterations * batch_size * args.pop_size))  # rounded up
    budget = num_generations * args.pop_size * iterations * batch_size  # the run's population steps
    target = args.target if args.target is not None else (gym.spec(args.env_id).reward_threshold or np.inf)
    ckpt, device = load_checkpoint(args.resume) if args.resume else None, pick_device(args.device)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cudnn.benchmark = not args.torch_deterministic
    args.run_dir = args.run_dir or f"runs/{args.env_id}__{SCRIPT}__{args.seed}__{int(time.time())}"
    os.makedirs(args.run_dir, exist_ok=True)
    path = {name: os.path.join(args.run_dir, name) for name in ("args.json", "episodes.csv", "updates.csv",
            "population.csv", "curve.png", "population.png", "checkpoint.pt")}
    json.dump(asdict(args), open(path["args.json"], "w"), indent=2)
    envs, fitness_envs = make_envs(args, args.num_envs), make_envs(args, args.eval_episodes)
    obs_dim, space = envs.single_observation_space.shape[0], envs.single_action_space
    rng, hidden = np.random.default_rng([args.seed, 0]), [args.hidden_size] * 2  # hparams: log-uniform
    keys = ("population", "generation", "global_step", "eval_steps", "elapsed")  # what a checkpoint holds
    population, generation, global_step, eval_steps, elapsed = (ckpt[k] for k in keys) if ckpt else (
        [dict(id=i, parent=-1, mutation="new", fitness=-np.inf, hidden=list(hidden), adam={},
              hparams={k: float(np.exp(rng.uniform(*np.log(b)))) for k, b in HPARAMS.items()},
              model=Agent(obs_dim, hidden, space).state_dict()) for i in range(args.pop_size)], 0, 0, 0, 0.0)
    logs = {}  # on resume: the rows up to the checkpoint are kept, later ones dropped, new ones appended
    for name, header in (("episodes.csv", "global_step,wall_time,return,length"),
                         ("updates.csv", "global_step,sps,learning_rate,clip_coef,pg_loss,v_loss,entropy,"
                                         "approx_kl,clipfrac,explained_variance,member"),
                         ("population.csv", "global_step,eval_steps,generation,member,parent,mutation,"
                                            "fitness,hidden," + ",".join(HPARAMS))):
        old = open(path[name]).read().split()[1:] if ckpt and os.path.exists(path[name]) else []
        logs[name] = open(path[name], "w", buffering=1)  # line-buffered: each row is in the file once written
        logs[name].write("\n".join([header] + [r for r in old if int(r.split(",")[0]) <= global_step]) + "\n")
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)  # shared by the members
    actions = torch.zeros((args.num_steps, args.num_envs) + space.shape, device=device,
                          dtype=torch.float32 if isinstance(space, gym.spaces.Box) else torch.long)
    logprobs, rewards, dones, values = (torch.zeros((args.num_steps, args.num_envs), device=device)
                                        for _ in range(4))  # each (num_steps, num_envs) float32
    # timer: the training's time (the rest is mostly fitness). A signal lets the generation finish (seconds).
    timer, stop, recent = dict(env=0.0, action=0.0, update=0.0), dict(signal=None, broken=False), []
    on_signal = lambda signum, frame: stop.update(signal=signum)
    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def save_all(plots=True):
        """One place for the save after each generation, the end, Ctrl-C, SIGTERM and a broken update."""
        if not stop["broken"]:  # never overwrite the last good checkpoint with a broken population
            save_checkpoint(path["checkpoint.pt"], **dict(zip(keys, (population, generation, global_step,
                            eval_steps, time.time() - start))), args=asdict(args))
        if plots:  # half a second: not after every generation
            title = f"{SCRIPT}.py, {args.env_id}, seed {args.seed}"
            plot_curve(path["episodes.csv"], path["curve.png"], title)
            plot_population(path["population.csv"], path["population.png"], title)

    def train_and_score(member, seed):
        """PPO on one member, --evo-steps steps from fresh envs (a cut episode bootstrapped); its fitness."""
        nonlocal global_step, eval_steps
        (agent, optimizer), hp = build(member, obs_dim, space, device), member["hparams"]
        next_obs = as_tensor(envs.reset(seed=seed)[0], device)  # (num_envs, obs_dim)
        next_done = torch.zeros(args.num_envs, device=device)
        for iteration in range(1, iterations + 1):
            lr = hp["learning_rate"] * ((1.0 - global_step / budget) if args.anneal_lr else 1.0)  # [core-4]
            optimizer.param_groups[0]["lr"] = lr  # a function of global_step: a resume picks it up
            # ------------------------------------------------------------ 2. rollout
            for step in range(args.num_steps):
                t0 = time.perf_counter()
                obs[step], dones[step] = next_obs, next_done
                with torch.no_grad():
                    actions[step], logprobs[step], _, values[step] = agent.get_action_and_value(next_obs)
                action_np = actions[step].cpu().numpy()  # the step's one wait on the device: the envs need it
                t1 = time.perf_counter()
                next_obs_np, reward, term, trunc, info = envs.step(action_np)
                global_step += args.num_envs
                # Truncation is not termination: add gamma * V(final observation). Terminated wins over both.
                bootstrap = trunc & ~term
                if bootstrap.any():
                    with torch.no_grad():
                        final_obs = as_tensor(np.stack(info["final_obs"][bootstrap]), device)
                        reward[bootstrap] += args.gamma * agent.get_value(final_obs).cpu().numpy()
                rewards[step], next_obs = as_tensor(reward, device), as_tensor(next_obs_np, device)
                next_done = as_tensor(term | trunc, device)
                for i in np.flatnonzero(info.get("_episode", [])):  # recent: every member's, for the bar
                    recent.append(info["episode"]["r"][i])
                    logs["episodes.csv"].write(f"{global_step},{time.time() - start:.1f},"
                                               f"{info['episode']['r'][i]:g},{info['episode']['l'][i]}\n")
                timer["action"] += t1 - t0
                timer["env"] += time.perf_counter() - t1  # the bookkeeping above counts as stepping
            # ------------------------------------------------------------ 3. advantages
            t0 = time.perf_counter()
            with torch.no_grad():  # each (num_steps, num_envs)
                advantages, returns = compute_gae(rewards, values, dones, agent.get_value(next_obs),
                                                  next_done, args.gamma, hp["gae_lambda"])
            # ------------------------------------------------------------ 4. update
            all_stats = []
            for epoch in range(args.update_epochs):
                for mb_inds in torch.randperm(batch_size, device=device).chunk(args.num_minibatches):
                    mb = lambda x: x.flatten(0, 1)[mb_inds]  # (num_steps, num_envs, ...) -> (mb size, ...)
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb(obs), mb(actions))
                    mb_advantages = mb(advantages)
                    if args.norm_adv:  # [core-7]
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    loss, stats = ppo_loss(newlogprob, mb(logprobs), mb_advantages, newvalue, mb(values),
                                           mb(returns), entropy, hp["clip_coef"], args.vf_coef,
                                           hp["ent_coef"], args.clip_vloss)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)  # [core-11]
                    optimizer.step()
                    all_stats.append(torch.stack([loss.detach(), *stats.values()]))
                if args.target_kl is not None and stats["approx_kl"].item() > args.target_kl:  # [aux-3]
                    break
            loss_mean, *stat_means = torch.stack(all_stats).mean(0).tolist()  # one GPU wait per update
            timer["update"] += time.perf_counter() - t0
            if not np.isfinite(loss_mean):  # exit 1; the finally below keeps the last good checkpoint
                stop["broken"] = True
                sys.exit(f"error: non-finite loss in update {iteration} of member {member['id']} (global step"
                         f" {global_step}); last good checkpoint: {path['checkpoint.pt']}")
            # ------------------------------------------------------------ 5. logging
            explained_var = (1 - (returns - values).var() / returns.var()).item()  # inf/nan: constant returns
            sps = global_step / (time.time() - start)  # the population's so far, fitness time included
            row = [global_step, sps, lr, hp["clip_coef"], *stat_means, explained_var, member["id"]]
            logs["updates.csv"].write(",".join(f"{x:.6g}" for x in row) + "\n")
            bar.update(batch_size)  # the bar's rate is the population's steps per second
            bar.set_postfix(ret=f"{np.mean(recent[-100:]):.1f}" if recent else "-", best=f"{best:.1f}")
        member["model"] = {k: v.detach().cpu() for k, v in agent.state_dict().items()}
        member["adam"] = {name: {k: v.cpu() for k, v in optimizer.state[p].items()}
                          for name, p in agent.named_parameters() if p in optimizer.state}
        # ---------------------------------------------------------------- 6. fitness
        returns, lengths = play(agent, fitness_envs, args.seed + generation, device)  # the same starts
        member["fitness"], eval_steps = float(returns.mean()), eval_steps + int(lengths.sum())
        row = [global_step, eval_steps, generation, *(member[k] for k in ("id", "parent", "mutation",
               "fitness")), "x".join(map(str, member["hidden"])), *member["hparams"].values()]
        logs["population.csv"].write(",".join(map(str, row)) + "\n")

    bar = tqdm(total=budget, initial=global_step, unit="step", dynamic_ncols=True)
    start, best = time.time() - elapsed, max(m["fitness"] for m in population)
    try:
        while generation < num_generations and best < target and stop["signal"] is None:
            for i, member in enumerate(population):  # sections 2 to 6 are in train_and_score
                train_and_score(member, args.seed + (generation * args.pop_size + i) * args.num_envs)
            generation, best = generation + 1, max(m["fitness"] for m in population)
            # ------------------------------------------------------------ 7. selection and mutation
            if args.evolve and generation < num_generations and best < target:
                population = next_generation(population, generation, args, obs_dim, space)
            save_all(plots=generation % 5 == 0)  # the plots take half a second: every 5th generation
    finally:
        bar.close()
        save_all()
        for f in [*logs.values(), envs, fitness_envs]:
            f.close()
        for s, handler in old_handlers.items():
            signal.signal(s, handler)
    total, seconds = max(sum(timer.values()), 1e-9), time.time() - start
    print(f"{global_step} population steps (+ {eval_steps} evaluation steps), {generation} generations, best "
          f"fitness {best:.1f}, {seconds:.0f} s, {global_step / seconds:.0f} population steps/s; time split: "
          + ", ".join(f"{k} {v:.0f} s ({100 * v / total:.0f}%)" for k, v in timer.items()))
    if stop["signal"] is not None:
        print(f"stopped by signal {stop['signal']}; continue with --resume {path['checkpoint.pt']}")
    return args.run_dir


if __name__ == "__main__":
    args = parse_args()
    evaluate(args) if args.eval else train(args)
