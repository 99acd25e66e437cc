"""PPO with LSTMs on CartPole, velocities hidden:
a policy without memory cannot balance it.

    python ppo_lstm.py  # 50k steps, a minute
    python ppo_lstm.py --no-memory  # the control
    python ppo_lstm.py --eval runs/<run> --gif a.gif

Tags: "The 37 Implementation Details of PPO" (Huang
et al., 2022). Left out: one LSTM for both (more
runs lost), CUDA graphs (slower), KL stop."""
import argparse
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

SCRIPT = "ppo_lstm"  # in every checkpoint
FORMAT = 4  # the checkpoint's layout

@dataclass
class Args:  # --help: the comment after each
    env_id: str = "CartPole-v1"  # the only task
    mask: str = "1,3"  # obs indices hidden, or none
    total_timesteps: int = 50_000  # steps of the run
    num_envs: int = 8  # [core-1] envs in parallel
    num_steps: int = 32  # steps per env per rollout
    learning_rate: float = 1e-3  # Adam's, at first
    num_minibatches: int = 1  # [core-6, lstm-4] per epoch
    update_epochs: int = 8  # passes over each rollout
    clip_coef: float = 0.2  # [core-8, core-9] ratio clip
    ent_coef: float = 0.0  # [core-10] entropy bonus
    memory: bool = True  # --no-memory: the control
    anneal_lr: bool = True  # [core-4] linearly to 0
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # [core-5] GAE's lambda
    norm_adv: bool = True  # [core-7] advantages
    clip_vloss: bool = True  # [core-9] value clip
    vf_coef: float = 0.5  # [core-10] value loss
    max_grad_norm: float = 0.5  # [core-11] grad clip
    seed: int = 1  # of torch and the envs
    device: str = "auto"  # auto (the CPU), cpu, cuda
    run_dir: str = ""  # default: runs/<env>__...
    save_interval: float = 300.0  # seconds per checkpoint
    resume: str = ""  # continue the run in this folder
    eval: str = ""  # play this run's policy
    eval_episodes: int = 20  # played by --eval
    deterministic: bool = False  # --eval: greedy
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

class RunningNorm(nn.Module):
    """Mean and variance of all batches; saved with weights."""

    def __init__(self, shape=()):
        super().__init__()
        self.mean = nn.Buffer(torch.zeros(shape).double())
        self.var = nn.Buffer(torch.ones(shape).double())
        self.count = nn.Buffer(torch.tensor(1e-4, dtype=torch.float64))

    def update(self, x):  # x: (batch, *shape)
        x = torch.as_tensor(x).to(self.mean)  # float64
        total = self.count + len(x)
        delta = x.mean(0) - self.mean
        self.mean += delta * len(x) / total
        squares = self.var * self.count + x.var(0, correction=0) * len(x)
        squares += delta ** 2 * self.count * len(x) / total
        self.var.copy_(squares / total)
        self.count.copy_(total)

    def forward(self, x):  # [cont-6, cont-7]
        return ((x - self.mean) / (self.var + 1e-8).sqrt()).clamp(-10, 10).float()

class Memory(nn.Module):
    """An LSTM, then a head on its outputs."""

    def __init__(self, out_size, std):
        super().__init__()
        self.lstm = nn.LSTM(64, 64)
        for param in self.lstm.parameters():  # [lstm-1]
            init = nn.init.orthogonal_ if param.dim() == 2 else nn.init.zeros_
            init(param)
        self.head = layer_init(nn.Linear(64, out_size), std)

    def forward(self, x, state, done):
        """x (T, B, 64) from state (h, c); done (T, B): 1
        starts an episode. -> (T * B, out), state after."""
        # [lstm-3] Zeroed where episodes start, not
        # rollouts; a stretch is one LSTM call.
        cuts = (done[1:].any(1).nonzero().flatten() + 1).tolist()
        outputs = []
        for stretch, starts in zip(x.tensor_split(cuts), done[[0, *cuts]]):
            keep = (1.0 - starts).view(1, -1, 1)
            out, state = self.lstm(stretch, (state[0] * keep, state[1] * keep))
            outputs.append(out)
        return self.head(torch.cat(outputs).flatten(0, 1)), state

class Agent(nn.Module):
    """An encoder, then actor and critic Memories
    [core-13]: one for both lost more runs."""

    def __init__(self, envs, args):
        super().__init__()
        # CartPole's x, v, angle, w: v and w hidden.
        self.visible = [i for i in range(4) if str(i) not in args.mask.split(",")]
        n = len(self.visible)  # seen
        self.obs_norm = RunningNorm(n)  # [cont-6]
        self.return_norm = RunningNorm()  # [cont-8]
        self.encoder = nn.Sequential(layer_init(nn.Linear(n, 64)), nn.Tanh())
        self.actor = Memory(envs.single_action_space.n, 0.01)
        self.critic = Memory(1, 1.0)
        self.memory = args.memory  # off: the control

    @torch.no_grad()  # for the rollout only
    def get_value(self, x, state):
        x = self.encoder(self.obs_norm(x[None, :, self.visible]))
        out, _ = self.critic.lstm(x, state)
        return self.critic.head(out[0]).squeeze(-1)

    def get_action_and_value(self, x, states, done, action=None, greedy=False):
        """x: (T, B, 4); states: actor's, critic's (h, c).
        -> action, log pi(a|x), entropy, V; states."""
        x = self.encoder(self.obs_norm(x[..., self.visible]))
        done = done if self.memory else torch.ones_like(done)  # the control
        logits, actor_state = self.actor(x, states[0], done)
        value, critic_state = self.critic(x, states[1], done)
        dist = torch.distributions.Categorical(logits=logits, validate_args=False)
        if action is None:
            action = logits.argmax(-1) if greedy else dist.sample()
        if self.memory:  # the control's stay zero
            states = (actor_state, critic_state)
        return action, dist.log_prob(action), dist.entropy(), value.squeeze(-1), states

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

def update(agent, optimizer, args, states, batch):
    """Epochs of minibatches of whole sequences
    [core-6, lstm-4] from the first states [lstm-5]."""
    stats = []
    for epoch in range(args.update_epochs):
        shuffled = torch.randperm(args.num_envs, device=batch["obs"].device)
        for mb_inds in shuffled.split(len(shuffled) // args.num_minibatches):
            mb = {k: x[:, mb_inds] for k, x in batch.items()}
            first = [(h[:, mb_inds], c[:, mb_inds]) for h, c in states]
            _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
                mb["obs"], first, mb["dones"], mb["actions"].flatten(0, 1))
            mb = {k: x.flatten(0, 1) for k, x in mb.items()}
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
            stats.append(dict(loss=loss.detach(), **mb_stats))
    return {k: torch.stack([s[k] for s in stats]).mean().item() for k in stats[0]}

def train(args):
    # ---- 1. setup
    batch_size = args.num_envs * args.num_steps
    num_iterations = math.ceil(args.total_timesteps / batch_size)
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.num_envs)
    agent = Agent(envs, args).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)  # [core-3]
    ckpt = load_checkpoint(args.resume) if args.resume else {}
    if ckpt:
        agent.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    iteration = ckpt.get("iteration", 0)  # updates done
    global_step = iteration * batch_size
    # The rollout, (num_steps, num_envs, ...) each.
    shape = (args.num_steps, args.num_envs)
    on_device = partial(torch.as_tensor, dtype=torch.float32, device=device)
    obs = torch.zeros(shape + envs.single_observation_space.shape, device=device)
    actions = torch.zeros(shape, dtype=torch.long, device=device)
    # bootstraps: gamma V(final); discounted returns.
    logprobs, values, bootstraps, dones = torch.zeros((4,) + shape, device=device)
    rewards, discounted = np.zeros((2,) + shape, np.float32)
    discounted_return = np.zeros(args.num_envs)
    next_obs, _ = envs.reset(seed=args.seed + iteration * args.num_envs)  # resume: new
    next_done = np.zeros(args.num_envs, bool)
    zeros = torch.zeros(1, args.num_envs, 64, device=device)
    states = [(zeros, zeros)] * 2  # [lstm-2] kept across rollouts

    with Run(args, num_iterations * batch_size, ckpt) as run:
        while iteration < num_iterations and not run.stop:
            # [core-4] A function of the iteration: a resume goes on.
            lr = args.learning_rate * (1.0 - iteration / num_iterations if args.anneal_lr else 1.0)
            optimizer.param_groups[0]["lr"] = lr
            # ---- 2. rollout
            first = states  # [lstm-5]
            bootstraps.zero_()
            for step in range(args.num_steps):
                obs[step] = on_device(next_obs)
                dones[step] = on_device(next_done)
                with torch.no_grad():  # the rollout only acts
                    actions[step], logprobs[step], _, values[step], states = \
                        agent.get_action_and_value(obs[[step]], states, dones[[step]])
                next_obs, reward, term, trunc, info = envs.step(actions[step].cpu().numpy())
                next_done = term | trunc
                global_step += args.num_envs
                rewards[step] = reward
                run.episodes(global_step, reward, next_done)
                discounted_return = discounted_return * args.gamma + reward
                discounted[step] = discounted_return
                discounted_return[next_done] = 0
                # A time limit is no death: V(final) joins r.
                cut = trunc & ~term
                if cut.any():
                    final_obs = on_device(np.stack(info["final_obs"][cut]))
                    state = [s[:, cut] for s in states[1]]
                    bootstraps[step, cut] = args.gamma * agent.get_value(final_obs, state)
            # ---- 3. advantages
            # [cont-8, 9] r / std(discounted return), clipped.
            agent.return_norm.update(discounted.reshape(-1))
            scale = (agent.return_norm.var.float() + 1e-8).sqrt()
            scaled = (on_device(rewards) / scale).clamp(-10, 10)
            advantages, returns = compute_gae(scaled + bootstraps, values, dones,
                                              agent.get_value(on_device(next_obs), states[1]),
                                              on_device(next_done), args.gamma, args.gae_lambda)
            # ---- 4. update
            means = update(agent, optimizer, args, first, dict(
                obs=obs, dones=dones, actions=actions, logprobs=logprobs,
                advantages=advantages, returns=returns, values=values))
            if not math.isfinite(means.pop("loss")):
                sys.exit(f"error: non-finite loss in update {iteration + 1}")
            # [cont-6] Moved after the update (it saw the old).
            agent.obs_norm.update(obs.flatten(0, 1)[:, agent.visible])
            iteration += 1
            # ---- 5. logging
            state = dict(model=agent.state_dict(), optimizer=optimizer.state_dict(),
                         iteration=iteration, global_step=global_step)
            run.log_update(global_step, state, learning_rate=lr, clip_coef=args.clip_coef, **means,
                           explained_variance=1 - ((returns - values).var() / returns.var()).item())
    envs.close()

# ==== Plumbing: flags, bookkeeping, evaluation ====
PLAY = {"eval_episodes", "deterministic", "gif", "seed"}
POSITIVE = ["learning_rate", "clip_coef", "max_grad_norm"]

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
    sizes = [f.name for f in fields(Args) if f.type is int and f.name != "seed"] + POSITIVE
    rules += [(k, "positive", 0 < value(k) < math.inf) for k in sizes]
    rules += [(k, "within [0, 1]", 0 <= value(k) <= 1) for k in ["gamma", "gae_lambda"]]
    rules += [(k, "0 or more", 0 <= value(k) < math.inf) for k in ["seed", "save_interval"]]
    rules += [
        ("num_minibatches", "a divisor of --num-envs",
         args.num_envs % max(1, args.num_minibatches) == 0),
        ("device", "auto, cpu or cuda (a GPU)",
         args.device in ["auto", "cpu"] or args.device == "cuda" and torch.cuda.is_available()),
        ("env_id", "CartPole-v1", args.env_id == "CartPole-v1"),
        ("mask", "none or indices 0-3", set(args.mask.split(",")) <= {*"0123", "none"}),
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
        for name in ["episodes.csv", "updates.csv"]:
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

@torch.no_grad()
def evaluate(args):
    """--eval: an episode per env, states kept."""
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    envs = make_envs(args, args.eval_episodes)
    agent = Agent(envs, args).to(device)
    agent.load_state_dict(load_checkpoint(args.eval)["model"])
    obs, _ = envs.reset(seed=args.seed)
    zeros = torch.zeros(1, args.eval_episodes, 64, device=device)
    states = [(zeros, zeros)] * 2  # carried along
    done = zeros[..., 0]  # (1, B): never reset
    scores = np.zeros(args.eval_episodes)
    over = np.zeros(args.eval_episodes, bool)
    frames = []  # episode 0's
    while not over.all():  # each has a time limit
        frames += [envs.envs[0].render()] if args.gif and not over[0] else []
        x = torch.as_tensor(obs[None], device=device)
        action, *_, states = agent.get_action_and_value(x, states, done, greedy=args.deterministic)
        obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
        scores += reward * ~over
        over |= term | trunc
    envs.close()
    if args.gif:  # half the frames, half size: 25 a second
        from PIL import Image
        images = [Image.fromarray(frame).reduce(2) for frame in frames[::2]]
        images[0].save(args.gif, save_all=True, append_images=images[1:], duration=40, loop=0)
    print(f"{len(scores)} episodes: {scores.mean():.1f} +- {scores.std():.1f}")
    return scores

if __name__ == "__main__":
    args = parse_args()
    run = evaluate if args.eval else train
    run(args)
