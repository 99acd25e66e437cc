"""PPO with evolved hyperparameters: a population
trains, is scored, and the fittest are copied.

    python ppo_evolve.py  # CartPole, 6 members
    python ppo_evolve.py --no-evolve  # the control
    python ppo_evolve.py --eval runs/<run> --gif best.gif

Tags: "The 37 Implementation Details of PPO" (Huang et
al., 2022). No annealing (core-4) or KL stop (aux-3):
the rate and clip range evolve. Discrete actions only.
"""
import argparse
import copy
import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass, fields
from functools import partial

if __name__ == "__main__":  # Ctrl-C on import: exit 130
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

SCRIPT = "ppo_evolve"  # in every checkpoint
FORMAT = 4  # the checkpoint's layout
HPARAMS = dict(learning_rate=(1e-5, 1e-2), ent_coef=(1e-4, 0.1),  # evolved
               clip_coef=(0.05, 0.5), gae_lambda=(0.8, 1.0))
MUTATIONS = dict(none=0.25, hparam=0.5, weights=0.25)  # odds
ENVS = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0"]

@dataclass
class Args:  # --help: the comment after each
    env_id: str = "CartPole-v1"  # or Acrobot-v1, MountainCar-v0
    total_timesteps: int = 600_000  # all members' steps
    num_envs: int = 8  # [core-1] envs in parallel
    num_steps: int = 128  # steps per env per rollout
    pop_size: int = 6  # members of the population
    evo_steps: int = 10_240  # a member's steps per generation
    tournament_size: int = 2  # drawn; the fittest is copied
    evolve: bool = True  # --no-evolve: random search
    target: float = 475.0  # best fitness to stop at
    num_minibatches: int = 4  # [core-6] per epoch
    update_epochs: int = 4  # passes over each rollout
    gamma: float = 0.99  # discount
    norm_adv: bool = True  # [core-7] advantages
    clip_vloss: bool = True  # [core-9] value clip
    vf_coef: float = 0.5  # [core-10] value loss
    max_grad_norm: float = 0.5  # [core-11] grad clip
    seed: int = 1  # of torch, envs, evolution
    device: str = "auto"  # auto (the CPU), cpu, cuda
    run_dir: str = ""  # default: runs/<env>__...
    save_interval: float = 300.0  # seconds per checkpoint
    resume: str = ""  # continue the run in this folder
    eval: str = ""  # play this run's fittest member
    eval_episodes: int = 10  # of fitness and --eval
    deterministic: bool = False  # play the likeliest action
    gif: str = ""  # --eval: a GIF of episode 0

def make_envs(args, num_envs):
    """Envs that reset in the step that ends an episode,
    which leaves its last observation in info["final_obs"]."""
    # Frames for --gif, drawn without a display.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    make = partial(gym.make, args.env_id, render_mode="rgb_array")
    return gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode="SameStep")

def layer_init(layer, std=2 ** 0.5):  # [core-2]
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.zeros_(layer.bias)
    return layer

def mlp(in_size, out_size, out_std):  # 64x64 tanh
    return nn.Sequential(layer_init(nn.Linear(in_size, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, out_size), std=out_std))

class Agent(nn.Module):
    """Separate actor and critic [core-13]."""

    def __init__(self, envs, args):
        super().__init__()
        obs_dim = envs.single_observation_space.shape[0]
        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.actor = mlp(obs_dim, envs.single_action_space.n, out_std=0.01)

    @torch.no_grad()  # for the rollout only
    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x, action=None, greedy=False):
        """x: (B, obs_dim); action: (B,), to score, or None.
        -> action, log pi(action|x), entropy, V."""
        logits = self.actor(x)
        dist = torch.distributions.Categorical(logits=logits, validate_args=False)
        if action is None:
            action = logits.argmax(-1) if greedy else dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(x).squeeze(-1)

# Generalized advantage estimation [core-5]:
#   delta_t = r_t + gamma V(s_t+1) (1 - d_t+1) - V(s_t)
#   A_t = delta_t + gamma lambda (1 - d_t+1) A_t+1
#   R_t = A_t + V(s_t), the critic's target
# d_t = dones[t] = 1: observation t starts an episode.
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

# The clipped objective as a loss [core-8..10], with
# r_t = pi(a_t|s_t) / pi_old(a_t|s_t), e = clip_coef:
#   L_clip = mean(max(-A r_t, -A clip(r_t, 1-e, 1+e)))
#   L_V = mean(max((V - R)^2, (V_clip - R)^2)) / 2,
#   V_clip = V_old + clip(V - V_old, -e, e) [core-9]
#   loss = L_clip - ent_coef H + vf_coef L_V
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
    approx_kl = ((ratio - 1) - logratio).mean()  # [core-12]
    clipfrac = ((ratio - 1).abs() > clip_coef).float().mean()
    stats = dict(pg_loss=pg_loss, v_loss=v_loss, entropy=entropy_loss,
                 approx_kl=approx_kl, clipfrac=clipfrac)
    return loss, {name: x.detach() for name, x in stats.items()}

def update(agent, optimizer, args, batch):
    """Epochs of shuffled minibatches [core-6]: mean stats."""
    batch = {k: x.flatten(0, 1) for k, x in batch.items()}
    stats = []
    for epoch in range(args.update_epochs):
        shuffled = torch.randperm(len(batch["obs"]), device=batch["obs"].device)
        for mb_inds in shuffled.split(len(shuffled) // args.num_minibatches):
            mb = {k: x[mb_inds] for k, x in batch.items()}
            *_, newlogprob, entropy, newvalue = agent.get_action_and_value(mb["obs"], mb["actions"])
            advantages = mb["advantages"]
            if args.norm_adv:  # [core-7]
                advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            loss, mb_stats = ppo_loss(
                newlogprob=newlogprob, oldlogprob=mb["logprobs"], advantages=advantages,
                newvalue=newvalue, oldvalue=mb["values"], returns=mb["returns"],
                entropy=entropy, clip_coef=args.clip_coef, vf_coef=args.vf_coef,
                ent_coef=args.ent_coef, clip_vloss=args.clip_vloss)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)  # [core-11]
            optimizer.step()
            stats.append(torch.stack([loss.detach(), *mb_stats.values()]))
    return dict(zip(["loss", *mb_stats], torch.stack(stats).mean(0).tolist()))

def fittest(members):
    return max(members, key=lambda m: m["fitness"])

def build(member, envs, args, device):
    """The member's agent and optimizer, from copies."""
    agent = Agent(envs, args).to(device)
    agent.load_state_dict(member["model"])
    optimizer = torch.optim.Adam(agent.parameters(), eps=1e-5)  # [core-3]
    if member["adam"]:  # a copy: Adam steps in place
        optimizer.load_state_dict(copy.deepcopy(member["adam"]))
    # After the load, which brings back the parent's rate.
    optimizer.param_groups[0]["lr"] = member["hparams"]["learning_rate"]
    return agent, optimizer

@torch.no_grad()  # it only acts
def play(agent, args, seed, device):
    """One episode per env -> returns, lengths; --gif."""
    envs = make_envs(args, args.eval_episodes)
    obs, _ = envs.reset(seed=seed)
    totals = np.zeros((2, envs.num_envs))  # returns, lengths
    over = np.zeros(envs.num_envs, bool)
    frames = []
    while not over.all():  # each has a time limit
        frames += [envs.envs[0].render()] if args.gif and not over[0] else []
        x = torch.as_tensor(obs, device=device)
        action = agent.get_action_and_value(x, greedy=args.deterministic)[0]
        obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
        totals += [reward * ~over, ~over]
        over |= term | trunc
    envs.close()
    if args.gif:  # half size, 25 per s
        from PIL import Image
        images = [Image.fromarray(frame).reduce(2) for frame in frames]
        images[0].save(args.gif, save_all=True, append_images=images[1:],
                       duration=40, loop=0)
    return totals

def next_generation(population, generation, args):
    """The elite, then tournament winners mutated once."""
    rng = np.random.default_rng([args.seed, generation])  # as on resume
    members = [fittest(population)]  # the elite
    for slot in range(1, args.pop_size):
        child = copy.deepcopy(fittest(
            rng.choice(population, args.tournament_size)))
        mutation = str(rng.choice(list(MUTATIONS),
                                  p=list(MUTATIONS.values())))
        if mutation == "hparam":  # x0.8 or x1.2, in bounds
            mutation = str(rng.choice(list(HPARAMS)))
            value = child["hparams"][mutation] * rng.choice([0.8, 1.2])
            child["hparams"][mutation] = float(np.clip(value, *HPARAMS[mutation]))
        elif mutation == "weights":  # noise: 0.1 x std
            g = torch.Generator().manual_seed(int(rng.integers(2**31)))
            for w in child["model"].values():
                if w.dim() == 2:
                    w += torch.randn(w.shape, generator=g) * 0.1 * w.std()
        members.append(dict(child, id=generation * args.pop_size + slot, parent=child["id"],
                            mutation=mutation, fitness=-np.inf))
    return members

def train_member(member, args, envs, device, run, global_step):
    """One member's PPO, in place -> agent, global_step."""
    # ---- 1. setup
    agent, optimizer = build(member, envs, args, device)
    args = argparse.Namespace(**vars(args), **member["hparams"])  # + its hparams
    # The rollout, (num_steps, num_envs, ...) each.
    shape = (args.num_steps, args.num_envs)
    on_device = partial(torch.as_tensor, dtype=torch.float32, device=device)
    obs = torch.zeros(shape + envs.single_observation_space.shape, device=device)
    actions = torch.zeros(shape, dtype=torch.long, device=device)
    # bootstraps: gamma V(final obs) at time limits.
    logprobs, values, bootstraps, rewards, dones = torch.zeros(
        (5,) + shape, device=device)
    next_obs, _ = envs.reset(seed=args.seed + global_step)  # new for each
    next_done = np.zeros(args.num_envs, bool)
    run.score[:] = run.length[:] = 0  # so are the episodes
    for _ in range(math.ceil(args.evo_steps / rewards.numel())):  # rollouts
        # ---- 2. rollout
        bootstraps.zero_()
        for step in range(args.num_steps):
            obs[step] = on_device(next_obs)
            dones[step] = on_device(next_done)
            with torch.no_grad():  # the rollout only acts
                actions[step], logprobs[step], _, values[step] = \
                    agent.get_action_and_value(obs[step])
            next_obs, reward, term, trunc, info = envs.step(actions[step].cpu().numpy())
            next_done = term | trunc
            global_step += args.num_envs
            rewards[step] = on_device(reward)
            run.episodes(global_step, reward, next_done)
            # A time limit is no death: V(final) joins r.
            cut = trunc & ~term
            if cut.any():
                final_obs = on_device(np.stack(info["final_obs"][cut]))
                bootstraps[step, cut] = args.gamma * agent.get_value(final_obs)
        # ---- 3. advantages
        advantages, returns = compute_gae(rewards + bootstraps, values, dones,
                                          agent.get_value(on_device(next_obs)),
                                          on_device(next_done), args.gamma, args.gae_lambda)
        # ---- 4. update
        means = update(agent, optimizer, args, dict(obs=obs, actions=actions, logprobs=logprobs,
                       advantages=advantages, returns=returns, values=values))
        if not math.isfinite(means.pop("loss")):
            sys.exit(f"error: non-finite loss, member {member['id']}")
        # ---- 5. logging
        run.log_update(global_step, None, learning_rate=args.learning_rate,
                       clip_coef=args.clip_coef, **means,
                       explained_variance=1 - ((returns - values).var() / returns.var()).item(),
                       member=member["id"])
    member.update(model=agent.cpu().state_dict(), adam=optimizer.state_dict())  # on CPU, for noise
    return agent, global_step

def train(args):
    # ---- 6. the population
    batch = args.num_envs * args.num_steps
    steps = args.pop_size * math.ceil(args.evo_steps / batch) * batch  # a generation's
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.num_envs)
    ckpt = load_checkpoint(args.resume) if args.resume else {}
    # A member: id (generation * pop_size + slot),
    # parent, mutation, fitness (-inf until scored),
    # hparams (log-uniform in HPARAMS), model, adam.
    rng = np.random.default_rng([args.seed, 0])
    population = ckpt.get("population") or [dict(
        id=i, parent=-1, mutation="new", fitness=-np.inf,
        hparams={k: float(np.exp(rng.uniform(*np.log(b))))
                 for k, b in HPARAMS.items()},
        model=Agent(envs, args).state_dict(), adam={})
        for i in range(args.pop_size)]
    global_step = ckpt.get("global_step", 0)  # all members'
    with Run(args, math.ceil(args.total_timesteps / steps) * steps, ckpt) as run:
        log = partial(print, sep=",", file=run.logs["population.csv"])  # in full
        if not ckpt:  # a new run
            log("global_step,eval_steps,generation,member,parent,mutation,fitness",
                *HPARAMS)
        # A stop waits for the generation, saved whole.
        while global_step < args.total_timesteps and not run.stop \
                and fittest(population)["fitness"] < args.target:
            generation = global_step // steps
            # ---- 7. selection, mutation
            if args.evolve and generation:
                population = next_generation(population, generation, args)
            for member in population:
                agent, global_step = train_member(member, args, envs, device,
                                                  run, global_step)
                # ---- 8. fitness: the same start states for all
                scores, lengths = play(agent, args, args.seed + generation, "cpu")
                member["fitness"] = float(scores.mean())
                log(global_step, int(lengths.sum()), generation,
                    *map(member.get, ["id", "parent", "mutation", "fitness"]),
                    *member["hparams"].values())
            run.bar.set_description(f"best {fittest(population)['fitness']:.1f}")
            # A copy: training changes the members.
            run.state = copy.deepcopy(dict(population=population,
                                           global_step=global_step))
    envs.close()

# ==== Plumbing: flags, bookkeeping, evaluation ====
PLAY = {"eval_episodes", "deterministic", "gif", "seed"}

def parse_args(argv=None):
    """Args from the command line or, with --resume or --eval,
    the checkpoint, all checked before anything is made."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    helps = dict(re.findall(r"\n    (\w+): \w+ = .+?  # (.+)", open(__file__).read()))
    for f in fields(Args):
        kind = dict(action=argparse.BooleanOptionalAction) if f.type is bool else dict(type=f.type)
        parser.add_argument("--" + f.name.replace("_", "-"), **kind, default=argparse.SUPPRESS,
                            help=f"{helps[f.name]} ({f.default})")
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
    value = vars(args).get
    sizes = [f.name for f in fields(Args) if f.type is int and f.name != "seed"]
    batch = args.num_envs * args.num_steps
    rules += [(k, "positive", 0 < value(k) < math.inf) for k in sizes + ["max_grad_norm"]]
    rules += [(k, "0 or more", 0 <= value(k) < math.inf) for k in ["seed", "save_interval"]]
    rules += [
        ("gamma", "within [0, 1]", 0 <= args.gamma <= 1),
        ("num_minibatches", f"a divisor of {batch}", batch % max(1, args.num_minibatches) == 0),
        ("device", "auto, cpu or cuda (a GPU)",
         args.device in ["auto", "cpu"] or args.device == "cuda" and torch.cuda.is_available()),
        ("env_id", f"one of {ENVS}", args.env_id in ENVS),
        ("resume", "left out with --eval", not (args.resume and args.eval)),
        ("gif", "given with --eval, in a folder that exists",
         not args.gif or args.eval and os.path.isdir(os.path.dirname(args.gif) or ".")),
        ("run_dir", f"new or empty (to go on: --resume {args.run_dir})",
         args.resume or args.eval or os.path.isdir(args.run_dir) and not os.listdir(args.run_dir)
         or not os.path.exists(args.run_dir) and not os.path.isfile(os.path.dirname(args.run_dir)))]
    for name, must in [(name, must) for name, must, ok in rules if not ok][:1]:
        parser.error(f"--{name.replace('_', '-')} must be {must}")
    return args

def pick_device(name):
    # One thread: small MLPs run faster so (README.md).
    torch.set_num_threads(1)
    return torch.device("cpu" if name == "auto" else name)

def load_checkpoint(path):
    """The checkpoint at path or in that folder, or exit 1."""
    path = f"{path}/checkpoint.pt" if os.path.isdir(path) else path
    try:  # plain data: a stranger's file runs no code
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        if [ckpt["script"], ckpt["format"]] != [SCRIPT, FORMAT]:
            raise ValueError(ckpt["script"])
    except Exception as e:  # sys.exit(text): exit 1
        sys.exit(f"error: {path}: not a {SCRIPT}.py checkpoint, format {FORMAT} ({e!r:.60})")
    return ckpt

class Run:
    """The run's bookkeeping: folder, CSV logs, progress bar,
    checkpoints. Ctrl-C or SIGTERM stop it after the update;
    leaving the `with` block saves everything."""

    def __init__(self, args, total_steps, ckpt):
        self.args = args
        self.dir = args.run_dir
        self.start = time.time() - ckpt.get("wall_time", 0)
        self.last = self.saved = time.time()
        os.makedirs(self.dir, exist_ok=True)
        json.dump(asdict(args), open(f"{self.dir}/args.json", "w"), indent=2)
        self.logs = {}
        # A resume drops the rows after its checkpoint.
        for name in ["episodes.csv", "updates.csv", "population.csv"]:
            rows = open(f"{self.dir}/{name}").read().split() if ckpt else []
            kept = rows[:1] + [r for r in rows[1:] if int(r.split(",")[0]) <= ckpt["global_step"]]
            self.logs[name] = open(f"{self.dir}/{name}", "w", buffering=1)
            self.logs[name].writelines(row + "\n" for row in kept)
        self.bar = tqdm(total=total_steps, initial=ckpt.get("global_step", 0), unit="step")
        self.score = np.zeros(args.num_envs)
        self.length = np.zeros(args.num_envs, int)
        self.recent = []  # the last 100 returns
        self.state = {}  # what the checkpoint holds
        self.stop = 0  # the signal that asked to stop
        for s in [signal.SIGINT, signal.SIGTERM]:
            signal.signal(s, self.ask_to_stop)

    def ask_to_stop(self, signum, frame):
        self.stop = signum
        tqdm.write("stopping; saving first")

    def episodes(self, global_step, reward, ended):
        """Adds a step's rewards; logs the episodes ended."""
        self.score += reward
        self.length += 1
        for i in np.flatnonzero(ended):
            row = {"global_step": global_step, "wall_time": round(time.time() - self.start, 1)}
            self.write("episodes.csv", {**row, "return": self.score[i], "length": self.length[i]})
            self.recent = self.recent[-99:] + [self.score[i]]
        self.score[ended] = 0
        self.length[ended] = 0

    def log_update(self, global_step, state, **row):
        """A row of updates.csv; state: a checkpoint or None."""
        sps = (global_step - self.bar.n) / (time.time() - self.last)
        self.last = time.time()
        self.write("updates.csv", dict(global_step=global_step, sps=sps, **row))
        self.bar.update(global_step - self.bar.n)
        self.bar.set_postfix(score=np.mean(self.recent or [math.nan]))
        self.state = state or self.state
        if time.time() - self.saved >= self.args.save_interval:
            self.save()

    def write(self, name, row):
        """A CSV row (a header first): 6 digits, ints whole."""
        if self.logs[name].tell() == 0:
            self.logs[name].write(",".join(row) + "\n")
        text = [str(x) if isinstance(x, int) else f"{x:.6g}" for x in row.values()]
        self.logs[name].write(",".join(text) + "\n")

    def save(self, checkpoint=True):
        """The checkpoint (renamed in place), curve.png."""
        if checkpoint and self.state:
            ckpt = dict(script=SCRIPT, format=FORMAT, args=asdict(self.args),
                        wall_time=time.time() - self.start, **self.state)
            torch.save(ckpt, f"{self.dir}/checkpoint.pt.tmp")
            os.replace(f"{self.dir}/checkpoint.pt.tmp", f"{self.dir}/checkpoint.pt")
        self.saved = time.time()
        import matplotlib.pyplot as plt
        rows = open(f"{self.dir}/episodes.csv").read().split()[1:]
        data = np.array([row.split(",") for row in rows], dtype=float).reshape(-1, 4)
        w = max(1, min(100, len(data) // 5))  # the window
        cumulative = np.cumsum(np.insert(data[:, 2], 0, 0.0))
        plt.plot(data[:, 0], data[:, 2], ".", alpha=0.3, label="one episode")
        plt.plot(data[w - 1:, 0], (cumulative[w:] - cumulative[:-w]) / w, label=f"mean of {w}")
        title = f"{SCRIPT}.py, {self.args.env_id}, seed {self.args.seed}"
        plt.gca().set(title=title, xlabel="environment steps", ylabel="episodic return")
        plt.legend()
        plt.savefig(f"{self.dir}/curve.png")
        plt.close()

    def __enter__(self):
        return self

    def __exit__(self, error, *_):
        # After an error the last good checkpoint stays.
        self.bar.close()
        self.save(checkpoint=error is None)
        if error is None and self.stop:  # exit 130 or 143
            print(f"stopped; continue with --resume {self.dir}")
            sys.exit(128 + self.stop)
        if error is None:
            score = np.mean(self.recent[-20:] or [math.nan])
            print(f"{self.dir}: return {score:.1f}; evaluate: python {SCRIPT}.py --eval {self.dir}")

def evaluate(args):
    """--eval: the fittest, one episode per env."""
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    best = fittest(load_checkpoint(args.eval)["population"])
    agent = build(best, make_envs(args, 1), args, device)[0]
    scores = play(agent, args, args.seed, device)[0]
    print(f"member {best['id']}, {len(scores)} episodes: {scores.mean():.1f} +- {scores.std():.1f}")
    return scores

if __name__ == "__main__":
    args = parse_args()
    run = evaluate if args.eval else train
    run(args)
