"""Shared by every test: the scripts the harness checks, how to load one, and how to run one."""
import csv
import importlib.util
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from tqdm import tqdm

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Each script joins the shared harness (test_math.py, test_spec.py, test_cli.py) by adding its name here.
SCRIPTS = ["ppo_atari", "ppo_continuous", "ppo_lstm", "ppo_evolve"]


def load_script(name):
    """Import ROOT/<name>.py as a module: importing one must parse, build and write nothing."""
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(name, *argv, timeout=600):
    """`python <name>.py argv...` in a fresh interpreter, as a user runs it; output captured."""
    return subprocess.run([sys.executable, str(ROOT / f"{name}.py"), *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


class InProcess:
    """A stand-in for ppo_evolve.py's pool of worker processes: the members train in the test's own process,
    where its monkeypatches reach them. The real pool is checked by runs in processes of their own."""

    def __init__(self, *args, **kwargs):
        pass

    def map(self, job, *iterables):
        return map(job, *iterables)

    def shutdown(self, **kwargs):
        pass


class DisabledBar(tqdm):
    """Every bar as TQDM_DISABLE=1 makes it (tqdm reads the variable when it is imported): its update() counts
    nothing. A test puts it in a script's place of tqdm."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, disable=True, **kwargs)


def train_to_the_end(P, args, status):
    """P.train(args), which must end with SystemExit(status), or return (a finished run) where status is 0."""
    if status:
        with pytest.raises(SystemExit) as e:
            P.train(args)
        assert e.value.code == status
    else:
        P.train(args)


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    """A run inside the test process takes over Ctrl-C and SIGTERM, as it does in its own process, and
    keeps them when it ends; give them back to pytest after each test."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in handlers.items():
        signal.signal(s, handler)


@pytest.fixture(params=SCRIPTS, scope="module")
def script(request):
    return load_script(request.param)


def stop_after_the_first_update(P, argv, monkeypatch):
    """P.train(argv), stopped as SIGTERM stops it once the first update (ppo_evolve: generation) is logged."""
    method = "log_generation" if P.SCRIPT == "ppo_evolve" else "log_update"
    original = getattr(P.Run, method)

    def log_and_stop(run, *args, **kwargs):
        original(run, *args, **kwargs)
        run.stop = signal.SIGTERM
    with monkeypatch.context() as m:
        m.setattr(P.Run, method, log_and_stop)
        with pytest.raises(SystemExit) as e:
            P.train(P.parse_args(argv))
    assert e.value.code == 143


def pooled_variance(batches, prior_count=1e-4):
    """The variance a RunningNorm should hold after taking in these batches, computed in one go, apart from its
    batch-by-batch merge: all the data pooled with its starting statistics (mean 0, variance 1, a count of 1e-4).
    For two groups, Var = sum over groups of count * (variance + (group mean - overall mean)^2) / total count."""
    x = np.concatenate([np.asarray(b, dtype=np.float64) for b in batches])
    total = len(x) + prior_count
    mean = x.sum(0) / total  # the starting mean is 0
    return (prior_count * (1 + mean ** 2) + len(x) * (x.var(0) + (x.mean(0) - mean) ** 2)) / total, mean


def discounted_sums(steps, gamma):
    """Each env's discounted sum of the rewards so far, at every step, restarted after an episode ends: what
    the return statistics take in. steps: (reward, terminated, truncated, ...) per vector step, in order."""
    sums, running = [], np.zeros(len(steps[0][0]))
    for reward, term, trunc, *_ in steps:
        running = running * gamma + reward
        sums.append(running.copy())
        running[term | trunc] = 0
    return np.concatenate(sums)


def spy_on_the_minibatches(P, monkeypatch):
    """Records, for each call of P.update, the rollout's rows and each minibatch's rows that reach ppo_loss, a
    row as (old log-probability, old value, return), numbers that are copied, never recomputed, on their way."""
    updates = []  # (the rollout's rows, [each minibatch's rows])
    update, loss = P.update, P.ppo_loss

    def rows(logprobs, values, returns):
        return torch.stack([x.detach().flatten() for x in (logprobs, values, returns)], 1)

    def spy_update(*args, **kwargs):
        batch = next(x for x in args if isinstance(x, dict))  # the rollout, by name
        updates.append((rows(batch["logprobs"], batch["values"], batch["returns"]), []))
        return update(*args, **kwargs)

    def spy_loss(**k):  # the scripts pass keyword arguments
        updates[-1][1].append(rows(k["oldlogprob"], k["oldvalue"], k["returns"]))
        return loss(**k)
    monkeypatch.setattr(P, "update", spy_update)
    monkeypatch.setattr(P, "ppo_loss", spy_loss)
    return updates


def assert_each_epoch_takes_every_row_once_in_a_new_order(updates, args):
    """[core-6] An epoch's minibatches, together, are the rollout's rows, each once (none dropped, none twice);
    the next epoch takes them in another order."""
    assert updates
    for rollout, minibatches in updates:
        assert len(minibatches) == args.update_epochs * args.num_minibatches
        epochs = [torch.cat(minibatches[i:i + args.num_minibatches])
                  for i in range(0, len(minibatches), args.num_minibatches)]
        for epoch in epochs:
            assert sorted(map(tuple, epoch.tolist())) == sorted(map(tuple, rollout.tolist()))
        assert all(len(mb) == len(rollout) // args.num_minibatches for mb in minibatches)
        assert not torch.equal(epochs[0], epochs[1])


def spy_on_the_losses(P, monkeypatch):
    """Records, for each call of P.update, the rollout's advantages as GAE left them and the keyword arguments of
    each minibatch's ppo_loss."""
    updates = []  # (the rollout's advantages, [each minibatch's ppo_loss arguments])
    update, loss = P.update, P.ppo_loss

    def spy_update(*args, **kwargs):
        batch = next(x for x in args if isinstance(x, dict))  # the rollout, by name
        updates.append((batch["advantages"].flatten().clone(), []))
        return update(*args, **kwargs)

    def spy_loss(**k):  # the scripts pass keyword arguments
        updates[-1][1].append(k)
        return loss(**k)
    monkeypatch.setattr(P, "update", spy_update)
    monkeypatch.setattr(P, "ppo_loss", spy_loss)
    return updates


def assert_advantages_normalized_per_minibatch(updates, args):
    """[core-7] With --norm-adv each minibatch's advantages are shifted and scaled by their own mean and std (to 0
    and 1); without it an epoch's minibatches take the rollout's advantages as GAE left them, each once."""
    for advantages, losses in updates:
        seen = [k["advantages"] for k in losses]
        if args.norm_adv:
            assert all(abs(a.mean()) < 1e-5 and abs(a.std() - 1) < 1e-4 for a in seen)
            assert advantages.std() != pytest.approx(1, abs=0.01)  # so the check above could fail
        else:
            epoch = torch.cat(seen[:args.num_minibatches])
            assert torch.equal(epoch.sort().values, advantages.sort().values)


def record_steps_and_the_agent(P, monkeypatch, training_only=False):
    """Every vector env P.make_envs makes records each step: (reward, term, trunc, final observations or None);
    P.Agent.get_value records the agent it ran for last. -> dict(steps=[...], agent=..., checked=0).
    training_only: envs of another size than --num-envs (ppo_evolve.py's fitness games) record nothing."""
    seen = dict(steps=[], agent=None, checked=0)
    make, get_value = P.make_envs, P.Agent.get_value

    def make_envs(args, num_envs, **overrides):
        envs = make(args, num_envs, **overrides)
        if training_only and num_envs != args.num_envs:
            return envs
        step = envs.step

        def recorded(action):
            out = step(action)
            final_obs = out[4].get("final_obs")
            final_obs = None if final_obs is None else final_obs.copy()
            seen["steps"].append((out[1].copy(), out[2].copy(), out[3].copy(), final_obs))
            return out
        envs.step = recorded
        return envs

    def spy(self, *args):
        seen["agent"] = self
        return get_value(self, *args)
    monkeypatch.setattr(P, "make_envs", make_envs)
    monkeypatch.setattr(P.Agent, "get_value", spy)
    return seen


def plus_bootstraps(rewards, steps, agent, gamma):
    """rewards (T, N) plus gamma * V(final observation) at each recorded step truncated and not terminated, V
    from the agent's get_value on the raw final observation -> the rewards compute_gae must be given."""
    expected = rewards.clone()
    for t, (_, term, trunc, final_obs) in enumerate(steps):
        for i in np.flatnonzero(trunc & ~term):
            expected[t, i] += gamma * agent.get_value(torch.as_tensor(final_obs[i])[None])[0]
    return expected


def measure_gradient_norms(monkeypatch):
    """Every Adam step records the norm of the whole gradient it takes (all its parameters together). -> [norm]"""
    norms, step = [], torch.optim.Adam.step

    def measured(adam, *args, **kwargs):
        grads = [p.grad.flatten() for group in adam.param_groups for p in group["params"] if p.grad is not None]
        norms.append(torch.cat(grads).norm().item())
        return step(adam, *args, **kwargs)
    monkeypatch.setattr(torch.optim.Adam, "step", measured)
    return norms


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds (end-to-end runs, learning checks)")
