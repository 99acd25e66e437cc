"""PPO with evolved hyperparameters: a population trains, is scored, and the fittest are copied.

    python ppo_evolve.py               # CartPole, 6 members, until one scores 475 (about 2 min)
    python ppo_evolve.py --no-evolve   # the control: the same population and budget, no selection
    python ppo_evolve.py --eval runs/<run>/checkpoint.pt --gif best.gif   # the fittest member

Evolutionary hyperparameter optimization for PPO, as AgileRL offers it. Tags name "The 37
Implementation Details of PPO" (Huang et al., 2022): core-1..13 but core-4. Left out on purpose:
annealing (core-4) and the target-KL stop (aux-3), as the rate and clip range evolve; Box actions
and normalization (cont-1..9), as each member would need its own statistics."""
import argparse
import contextlib
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

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical
from tqdm import tqdm

SCRIPT = "ppo_evolve"  # written into every checkpoint, so that a foreign file is recognised
FORMAT = 3  # the checkpoint's layout: 3 has no hidden widths and keeps Adam's state_dict
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, and what a job scheduler sends
HPARAMS = dict(learning_rate=(1e-5, 1e-2), ent_coef=(1e-4, 0.1), clip_coef=(0.05, 0.5),
               gae_lambda=(0.8, 1.0))  # evolved; bounds wide on purpose: some members are bad
MUTATIONS = dict(none=0.25, hparam=0.5, weights=0.25)  # what a copy gets, at these odds
ENVS = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0"]  # flat observations, Discrete actions


@dataclass
class Args:  # every flag: --help shows the comment after each field
    # experiment
    seed: int = 1  # seed of torch, of the envs and of the evolution
    device: str = "auto"  # auto (the CPU: faster for these small networks), cpu or cuda
    run_dir: str = ""  # the run's folder (empty: runs/<env>__ppo_evolve__<seed>__<unix time>)
    resume: str = ""  # continue the run of this checkpoint, with the arguments saved in it
    eval: str = ""  # play --eval-episodes episodes with this checkpoint's fittest member
    eval_episodes: int = 10  # episodes (one per env) that score a member, and that --eval plays
    deterministic: bool = False  # --eval takes the most likely action instead of sampling
    gif: str = ""  # --eval also writes the first episode to this GIF file
    # environment
    env_id: str = "CartPole-v1"  # gymnasium env, one of ENVS
    total_timesteps: int = 600_000  # environment steps of the run, all members together
    num_envs: int = 8  # envs stepped in parallel [core-1]
    # evolution
    pop_size: int = 6  # members of the population
    evo_steps: int = 10_240  # steps each member trains in a generation (whole rollouts)
    tournament_size: int = 2  # members drawn for a tournament; the fittest of them is copied
    evolve: bool = True  # select and mutate; --no-evolve: random search, the control
    target: float = 475.0  # stop once the best fitness reaches this (CartPole-v1's threshold)
    # algorithm (learning rate, entropy coefficient, clip range and GAE lambda evolve: HPARAMS)
    num_steps: int = 128  # steps per env per rollout
    gamma: float = 0.99  # discount factor
    num_minibatches: int = 4  # minibatches per epoch [core-6]
    update_epochs: int = 4  # passes over each rollout
    norm_adv: bool = True  # normalize advantages per minibatch [core-7]
    clip_vloss: bool = True  # clip the value loss [core-9]
    vf_coef: float = 0.5  # value loss coefficient [core-10]
    max_grad_norm: float = 0.5  # global gradient norm clip [core-11]


def parse_args(argv=None):
    """Args from the command line; with --resume or --eval, the checkpoint's own."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    helps = dict(re.findall(r"\n    (\w+): \w+ = .+?  # (.+)", open(__file__).read()))
    choices = dict(device=["auto", "cpu", "cuda"], env_id=ENVS)
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
    for name in [name for name in sizes if getattr(args, name) <= 0]:  # parser.error: exit 2
        parser.error(f"--{name.replace('_', '-')} must be positive")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        parser.error(f"--num-minibatches must divide num_envs * num_steps = {batch_size}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is visible")
    if args.gif and not args.eval:
        parser.error("--gif goes with --eval")
    folder = args.run_dir or "runs"
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
    if not args.eval and not os.access(folder, os.W_OK):
        parser.error(f"--run-dir {folder}: cannot create or write that folder")
    return args


def make_envs(args, num_envs):
    """Same-step autoreset: every stored step is real; info["final_obs"] has the one it ended on."""
    make = partial(gym.make, args.env_id, render_mode="rgb_array")  # drawn only for --gif
    envs = gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode="SameStep")
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)  # info["episode"] at the end


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)  # [core-2] orthogonal weights, constant bias
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_size, out_size, out_std):  # 64x64 tanh; the head picks the last layer's scale [core-2]
    return nn.Sequential(layer_init(nn.Linear(in_size, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, out_size), std=out_std))


class Agent(nn.Module):  # separate actor and critic MLPs [core-13]
    def __init__(self, envs):
        super().__init__()
        obs_dim = envs.single_observation_space.shape[0]
        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.actor = mlp(obs_dim, envs.single_action_space.n, out_std=0.01)  # nearly uniform

    @torch.no_grad()  # for the rollout only
    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x, action=None, greedy=False):
        """The action (sampled, unless given), its log-probability, the entropy and V(x)."""
        logits = self.actor(x)
        dist = Categorical(logits=logits, validate_args=False)
        if action is None:
            action = logits.argmax(-1) if greedy else dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(x).squeeze(-1)


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


def minibatch_step(agent, optimizer, args, batch, hparams, mb):
    """One gradient step on the rows mb of the flattened rollout; the loss and its stats."""
    b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values = batch
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
    mb_advantages = b_advantages[mb]
    if args.norm_adv:  # [core-7]
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
    loss, stats = ppo_loss(newlogprob, b_logprobs[mb], mb_advantages, newvalue, b_values[mb],
                           b_returns[mb], entropy, hparams["clip_coef"], args.vf_coef,
                           hparams["ent_coef"], args.clip_vloss)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)  # [core-11]
    optimizer.step()
    return loss.detach(), stats


def first_population(args, envs):
    """Members are plain data: id (generation * pop_size + slot), parent, mutation, fitness (-inf
    until scored), hparams (drawn log-uniformly within HPARAMS), the state dicts model and adam."""
    rng = np.random.default_rng([args.seed, 0])
    population = []
    for i in range(args.pop_size):
        hparams = {k: float(np.exp(rng.uniform(*np.log(b)))) for k, b in HPARAMS.items()}
        population.append(dict(id=i, parent=-1, mutation="new", fitness=-np.inf,
                               hparams=hparams, model=Agent(envs).state_dict(), adam={}))
    return population


def build(member, envs, device):
    """The member's network and optimizer, from copies of its weights and Adam state."""
    agent = Agent(envs).to(device)
    agent.load_state_dict(member["model"])
    optimizer = torch.optim.Adam(agent.parameters(), eps=1e-5)  # [core-3]
    if member["adam"]:  # a copy: loaded as it is, Adam would step the member's tensors in place
        optimizer.load_state_dict(copy.deepcopy(member["adam"]))
    # Set after the load, which brings back the rate saved with the state (a copy's: its parent's)
    optimizer.param_groups[0]["lr"] = member["hparams"]["learning_rate"]
    return agent, optimizer


@torch.no_grad()  # it only acts
def play(agent, envs, seed, device, greedy=False, frames=None):
    """One episode per env (greedy: the likeliest actions); a list frames gets env 0's images."""
    obs, _ = envs.reset(seed=seed)
    returns = np.zeros(envs.num_envs)
    lengths = np.zeros(envs.num_envs)
    over = np.zeros(envs.num_envs, bool)
    while not over.all():  # every episode ends, by itself or at its step limit
        if frames is not None and not over[0]:
            frames.append(envs.unwrapped.envs[0].render())  # unwrapped: under the wrapper
        x = torch.as_tensor(obs, device=device)  # float32 in every env of ENVS
        action = agent.get_action_and_value(x, greedy=greedy)[0]
        obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
        returns += reward * ~over
        lengths += ~over
        over |= term | trunc
    return returns, lengths


def next_generation(population, generation, args):
    """The fittest as it is (elitism), then copies of tournament winners, each mutated once."""
    rng = np.random.default_rng([args.seed, generation])  # the same draws after a resume
    members = [max(population, key=lambda m: m["fitness"])]  # the elite
    for slot in range(1, args.pop_size):
        entrants = rng.choice(population, args.tournament_size)
        child = copy.deepcopy(max(entrants, key=lambda m: m["fitness"]))  # Adam too
        child.update(id=generation * args.pop_size + slot, parent=child["id"], fitness=-np.inf)
        child["mutation"] = str(rng.choice(list(MUTATIONS), p=list(MUTATIONS.values())))
        if child["mutation"] == "hparam":  # one hyperparameter x0.8 or x1.2, within its bounds
            name = str(rng.choice(list(HPARAMS)))
            value = child["hparams"][name] * rng.choice([0.8, 1.2])
            child["hparams"][name] = float(np.clip(value, *HPARAMS[name]))
            child["mutation"] = name
        elif child["mutation"] == "weights":  # noise on each weight matrix, 0.1 x its spread
            g = torch.Generator().manual_seed(int(rng.integers(2**31)))
            for w in child["model"].values():
                if w.dim() == 2:
                    w += torch.randn(w.shape, generator=g) * 0.1 * w.std()
        members.append(child)
    return members


def train_member(member, args, envs, device, logs, global_step, start):
    """Trains the member in place. -> its agent (on the CPU), global_step, why it broke off."""
    agent, optimizer = build(member, envs, device)
    hparams = member["hparams"]
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    # The rollout on the device; rewards and dones on the host until its end.
    shape = (args.num_steps, args.num_envs)
    obs = torch.zeros(shape + envs.single_observation_space.shape, device=device)
    actions = torch.zeros(shape, dtype=torch.long, device=device)
    logprobs = torch.zeros(shape, device=device)
    values = torch.zeros(shape, device=device)
    rewards = np.zeros(shape, np.float32)
    dones = np.zeros(shape, np.float32)
    on_device = partial(torch.as_tensor, dtype=torch.float32, device=device)
    next_obs, _ = envs.reset(seed=args.seed + global_step)  # new for each member
    next_done = np.zeros(args.num_envs, bool)
    policy = torch.no_grad()(agent.get_action_and_value)  # the rollout only acts: no gradient
    for _ in range(math.ceil(args.evo_steps / batch_size)):
        iteration_start = time.time()
        # ---------------------------------------------------------------- 1. rollout
        for step in range(args.num_steps):
            obs[step] = on_device(next_obs)  # (num_envs, obs_dim)
            dones[step] = next_done
            actions[step], logprobs[step], _, values[step] = policy(obs[step])
            action_np = actions[step].cpu().numpy()  # the step's one wait for the device
            next_obs, reward, term, trunc, info = envs.step(action_np)
            next_done = term | trunc
            global_step += args.num_envs
            # Truncation is not termination: V(final observation) joins the reward.
            bootstrap = trunc & ~term
            if bootstrap.any():
                final_obs = on_device(np.stack(info["final_obs"][bootstrap]))
                final_value = agent.get_value(final_obs).cpu().numpy()
                reward[bootstrap] += args.gamma * final_value
            rewards[step] = reward
            for i in np.flatnonzero(info.get("_episode", [])):  # the episodes that ended
                wall_time = round(time.time() - start, 1)
                episode = [info["episode"]["r"][i], info["episode"]["l"][i]]
                write_row(logs["episodes.csv"], [global_step, wall_time, *episode])
        # ---------------------------------------------------------------- 2. advantages
        next_value = agent.get_value(on_device(next_obs))
        advantages, returns = compute_gae(
            on_device(rewards), values, on_device(dones), next_value,
            on_device(next_done), args.gamma, hparams["gae_lambda"])
        # ---------------------------------------------------------------- 3. update
        flat = [x.flatten(0, 1) for x in (obs, actions, logprobs, advantages, returns, values)]
        all_stats = []  # per minibatch: the loss, ppo_loss's stats
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device)
            for begin in range(0, batch_size, minibatch_size):
                mb = b_inds[begin:begin + minibatch_size]
                loss, stats = minibatch_step(agent, optimizer, args, flat, hparams, mb)
                all_stats.append(torch.stack([loss, *stats.values()]))
        means = dict(zip(["loss", *stats], torch.stack(all_stats).mean(0).tolist()))
        if not math.isfinite(means["loss"]):
            broken = f"non-finite loss at step {global_step} (member {member['id']})"
            return agent, global_step, broken
        # ---------------------------------------------------------------- 4. logging
        sps = batch_size / (time.time() - iteration_start)
        row = dict(global_step=global_step, sps=sps, member=member["id"], **hparams)
        row |= means
        # explained variance: 1 for a perfect critic, 0 a mean (-inf or nan: constant returns)
        unexplained = (returns - values).var() / returns.var()
        row["explained_variance"] = 1 - unexplained.item()
        columns = HEADERS["updates.csv"].split(",")
        write_row(logs["updates.csv"], [row[k] for k in columns])
    member["model"] = agent.cpu().state_dict()  # on the CPU, where mutation noise is drawn
    member["adam"] = optimizer.state_dict()
    return agent, global_step, ""


def train(args):
    # -------------------------------------------------------------------- 5. the population
    batch_size = args.num_envs * args.num_steps
    iterations = math.ceil(args.evo_steps / batch_size)  # updates per member and generation
    generation_steps = args.pop_size * iterations * batch_size
    num_generations = math.ceil(args.total_timesteps / generation_steps)
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.num_envs)
    fitness_envs = make_envs(args, args.eval_episodes)
    ckpt = load_checkpoint(args.resume) if args.resume else dict(generation=0)
    generation = ckpt["generation"]  # generations done
    population = ckpt.get("population") or first_population(args, envs)
    global_step = generation * generation_steps  # all members together
    path, logs = open_run(args, global_step)
    stop = []  # a signal asks to stop: the generation is finished, everything saved, then it stops
    handlers = {s: signal.signal(s, lambda s, _: stop.append(s)) for s in STOP_SIGNALS}
    broken = ""  # why training stopped early, if it did
    bar = tqdm(total=num_generations, initial=generation, unit="generation")
    start = time.time()  # wall_time in episodes.csv counts from the start
    best = max(m["fitness"] for m in population)
    try:
        while generation < num_generations and best < args.target and not stop:
            # -------------------------------------------------------- 6. selection, mutation
            if args.evolve and generation > 0:  # of the last generation
                population = next_generation(population, generation, args)
            for member in population:  # each trains, then is scored
                agent, global_step, broken = train_member(
                    member, args, envs, device, logs, global_step, start)
                if broken:
                    break
                # ---------------- 7. fitness: on the same start states for every member, on the CPU
                scores, lengths = play(agent, fitness_envs, args.seed + generation, "cpu")
                member["fitness"] = float(scores.mean())
                row = [global_step, int(lengths.sum()), generation, member["id"], member["parent"],
                       member["mutation"], member["fitness"], *member["hparams"].values()]
                print(*row, sep=",", file=logs["population.csv"])  # numbers in full
            if broken:
                break
            generation += 1
            best = max(m["fitness"] for m in population)
            save_all(path, logs, args, population, generation)
            bar.update(1)
            bar.set_postfix(best=best)
    finally:  # logs and curve, however it ends; the checkpoint stays the last whole generation's
        bar.close()
        envs.close()
        fitness_envs.close()
        save_all(path, logs, args, population, generation, keep_last=True)
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if broken:
        sys.exit(f"error: {broken}; {path['checkpoint.pt']} keeps the last good one")
    print(f"{global_step} population steps, {generation} generations, "
          f"best fitness {best:.1f}")
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


def save_all(path, logs, args, population, generation, keep_last=False):
    """Flush the logs, write the checkpoint (keep_last: keep the last good one), draw the curve."""
    for log in logs.values():
        log.flush()
    ckpt = dict(script=SCRIPT, format=FORMAT, population=population, args=asdict(args),
                generation=generation)
    if not keep_last:  # written whole, then renamed: a crash mid-write spares the last one
        torch.save(ckpt, path["checkpoint.pt"] + ".tmp")
        os.replace(path["checkpoint.pt"] + ".tmp", path["checkpoint.pt"])
    plot_curve(path, f"{SCRIPT}.py, {args.env_id}, seed {args.seed}")


HEADERS = {"episodes.csv": "global_step,wall_time,return,length",
           "updates.csv": "global_step,sps,learning_rate,clip_coef,pg_loss,v_loss,entropy,"
                          "approx_kl,clipfrac,explained_variance,member",
           "population.csv": "global_step,eval_steps,generation,member,parent,mutation,"
                             "fitness," + ",".join(HPARAMS)}


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
        kept = [row for row in rows if int(row.split(",")[0]) <= global_step]
        logs[name] = open(path[name], "w")
        logs[name].write("\n".join([header, *kept]) + "\n")
    return path, logs


def write_row(log, values):
    """One row of a CSV log: numbers to 6 significant digits, whole numbers whole."""
    log.write(",".join(str(x) if isinstance(x, int) else f"{x:.6g}" for x in values) + "\n")


def evaluate(args):
    """Play --eval-episodes episodes, one per env, with the checkpoint's fittest member."""
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    best = max(load_checkpoint(args.eval)["population"], key=lambda m: m["fitness"])
    envs = make_envs(args, args.eval_episodes)
    agent = build(best, envs, device)[0]
    frames = []  # env 0's images
    scores = play(agent, envs, args.seed, device, args.deterministic, frames)[0]
    envs.close()
    if args.gif:
        from PIL import Image
        images = [Image.fromarray(frame).reduce(2) for frame in frames]  # 25 steps a second
        images[0].save(args.gif, save_all=True, append_images=images[1:], duration=40, loop=0)
    print(f"eval {args.env_id}, member {best['id']}, {len(scores)} episodes: "
          f"{scores.mean():.1f} +- {scores.std():.1f}")
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
