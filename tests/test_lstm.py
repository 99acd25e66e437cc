"""Checks of what only ppo_lstm.py has: hidden states that travel right, and its command line (SPEC.md)."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, load_script

P = load_script("ppo_lstm")


def run(*argv, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "ppo_lstm.py"), *argv], capture_output=True, text=True,
                          timeout=timeout)


def step_by_step(agent, x, state, done):
    """Reference: each LSTM (the actor's, then the critic's; state[i][k] is LSTM k's) one step at a time, its
    state zeroed before every step that starts an episode."""
    features, hs, cs = [], [], []
    for k, lstm in enumerate(agent.lstms):
        h, c = state[0][k:k + 1], state[1][k:k + 1]
        outputs = []
        for t in range(len(x)):
            keep = (1.0 - done[t]).view(1, -1, 1)
            out, (h, c) = lstm(agent.encoder(agent.obs_norm(x[t:t + 1])), (h * keep, c * keep))
            outputs.append(out)
        features.append(torch.cat(outputs).flatten(0, 1))
        hs.append(h)
        cs.append(c)
    return features, (torch.cat(hs), torch.cat(cs))


def test_states_reset_where_an_episode_starts_and_only_there():
    torch.manual_seed(0)
    import gymnasium as gym
    agent = P.Agent(3, P.Args(mask="none", hidden_size=16), gym.spaces.Discrete(2))
    T, B = 12, 4
    x = torch.randn(T, B, 3)
    state = (torch.randn(2, B, 16), torch.randn(2, B, 16))  # a state carried over from an earlier rollout
    done = torch.zeros(T, B)
    done[0, 1] = done[3, 0] = done[3, 2] = done[7, 0] = done[11, 3] = 1
    features, (h, c) = agent.get_states(x, state, done)
    ref_features, (ref_h, ref_c) = step_by_step(agent, x, state, done)
    assert len(features) == 2 and not torch.allclose(features[0], features[1])  # two LSTMs, not one twice
    for feature, ref_feature in zip(features, ref_features):
        torch.testing.assert_close(feature, ref_feature, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c, ref_c, rtol=1e-5, atol=1e-6)
    # Where an episode starts the carried state is forgotten: env 1 starts at t=0, so its features do not
    # depend on the state carried in; env 3 starts nothing before t=11, so its early features do.
    other = (state[0] * 2, state[1] * 2)
    for new, old in zip(agent.get_states(x, other, done)[0], features):
        changed = (new - old).abs().reshape(T, B, 16).amax(-1)
        assert (changed[:, 1] == 0).all() and (changed[:11, 3] > 0).all() and (changed[3:, 0] == 0).all()


def test_the_actor_reads_only_its_lstm_and_the_critic_only_its_own():
    torch.manual_seed(0)
    import gymnasium as gym
    agent = P.Agent(3, P.Args(mask="none", hidden_size=16), gym.spaces.Discrete(2))
    x, done, state = torch.randn(5, 4, 3), torch.zeros(5, 4), (torch.zeros(2, 4, 16),) * 2
    _, logprob, _, value, _ = agent.get_action_and_value(x, state, done, torch.zeros(20, dtype=torch.long))
    # Which LSTM's weights each output depends on: the gradient is zero (or absent) for the other one's.
    actor_lstm, critic_lstm = (list(lstm.parameters()) for lstm in agent.lstms)
    for output, own, other in ((logprob, actor_lstm, critic_lstm), (value, critic_lstm, actor_lstm)):
        grads = torch.autograd.grad(output.sum(), own + other, allow_unused=True, retain_graph=True)
        reached = [g is not None and g.abs().sum() > 0 for g in grads]
        assert all(reached[:len(own)]) and not any(reached[len(own):])


@pytest.mark.slow
@pytest.mark.parametrize("env_id,memory", [("CartPole-v1", "lstm"), ("Pendulum-v1", "lstm"),
                                           ("CartPole-v1", "none")])
def test_update_recomputes_the_rollouts_numbers(tmp_path, monkeypatch, env_id, memory):
    # The update replays each env's sequence from the rollout's initial state: before the optimizer has
    # stepped, the log-probabilities and values it computes must be the ones the rollout stored. Any hidden
    # state that is wrong (zeroed at a rollout boundary, not reset at an episode start, misaligned) breaks it.
    calls, original = [], P.ppo_loss
    def spy(*a, **k):
        calls.append([x.detach().clone() for x in a[:5]])
        return original(*a, **k)
    monkeypatch.setattr(P, "ppo_loss", spy)
    args = P.Args(env_id=env_id, memory=memory, total_timesteps=3 * 8 * 32, run_dir=str(tmp_path))
    P.train(args)
    per_update = args.update_epochs * args.num_minibatches
    assert len(calls) == 3 * per_update
    for update in range(3):
        newlogprob, oldlogprob, _, newvalue, oldvalue = calls[update * per_update]
        torch.testing.assert_close(newlogprob, oldlogprob, rtol=0, atol=1e-5)
        torch.testing.assert_close(newvalue, oldvalue, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_state_is_carried_across_rollouts(tmp_path, monkeypatch):
    # The state the second rollout starts from is the state the first one ended with, not zeros.
    seen, original = [], P.Agent.get_states
    def spy(self, x, state, done):
        features, new_state = original(self, x, state, done)
        if len(x) == 1 and x.shape[1] == 8:  # rollout steps only
            seen.append((state[0].clone(), done.clone(), new_state[0].clone()))
        return features, new_state
    monkeypatch.setattr(P.Agent, "get_states", spy)
    P.train(P.Args(total_timesteps=2 * 8 * 32, run_dir=str(tmp_path)))
    state_in, done, _ = seen[32]  # the first step of the second rollout
    assert torch.equal(state_in, seen[31][2]) and state_in.abs().sum() > 0


@pytest.mark.parametrize("argv,flag", [
    (["--num-minibatches", "3"], "--num-minibatches"),
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--env-id", "FrozenLake-v1"], "--env-id"),
    (["--mask", "7"], "--mask"),
    (["--mask", "x"], "--mask"),
    (["--memory", "gru"], "--memory"),
    (["--num-envs", "0"], "--num-envs"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        P.parse_args(argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err.strip().splitlines()[-1]


def test_masks():
    import gymnasium as gym
    assert P.parse_args([]).mask == "1,3" and P.parse_args(["--env-id", "Pendulum-v1"]).mask == "2"
    assert P.parse_args(["--mask", "none"]).mask == "none" and P.parse_args(["--mask", "0,2"]).mask == "0,2"
    assert P.Agent(4, P.parse_args([]), gym.spaces.Discrete(2)).visible.tolist() == [0, 2]
    assert P.Agent(3, P.parse_args(["--mask", "none"]), gym.spaces.Discrete(2)).visible.tolist() == [0, 1, 2]


@pytest.mark.slow
def test_run_resume_eval_gif_and_normalization_saved(tmp_path):
    run_dir = tmp_path / "run"
    out = run("--total-timesteps", "512", "--run-dir", str(run_dir), "--save-interval", "0")
    assert out.returncode == 0, out.stderr
    assert "time split: env" in out.stdout
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] == 512 and ckpt["model"]["obs_norm.count"] > 256  # the statistics travel with it
    out = run("--resume", str(run_dir / "checkpoint.pt"), "--num-envs", "4")
    assert out.returncode == 2 and "--num-envs" in out.stderr.strip().splitlines()[-1]
    gif = tmp_path / "episode.gif"
    out = run("--eval", str(run_dir / "checkpoint.pt"), "--eval-episodes", "3", "--gif", str(gif))
    assert out.returncode == 0, out.stderr
    assert "3 episodes: " in out.stdout and gif.stat().st_size > 1000
    (tmp_path / "broken.pt").write_bytes((run_dir / "checkpoint.pt").read_bytes()[:200])
    out = run("--eval", str(tmp_path / "broken.pt"))
    assert out.returncode == 1 and "Traceback" not in out.stderr and "broken.pt" in out.stderr


@pytest.mark.slow
def test_eval_sees_the_training_normalization(tmp_path, monkeypatch):
    # An evaluated checkpoint normalizes observations with the statistics the training run saved, frozen:
    # every observation --eval shows the agent is normalized with exactly those.
    out = run("--total-timesteps", "1024", "--run-dir", str(tmp_path), "--save-interval", "0")
    assert out.returncode == 0, out.stderr
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"]
    assert saved["obs_norm.count"] > 512 and not torch.equal(saved["obs_norm.mean"], torch.zeros(2).double())
    seen, original = [], P.RunningNorm.forward
    def spy(self, x):
        seen.append((self.mean.clone(), self.var.clone(), self.count.clone()))
        return original(self, x)
    monkeypatch.setattr(P.RunningNorm, "forward", spy)
    P.evaluate(P.parse_args(["--eval", str(tmp_path / "checkpoint.pt"), "--eval-episodes", "2"]))
    assert len(seen) > 10
    for mean, var, count in seen:
        assert torch.equal(mean, saved["obs_norm.mean"]) and torch.equal(var, saved["obs_norm.var"])
        assert torch.equal(count, saved["obs_norm.count"])


@pytest.mark.slow
def test_learns_masked_cartpole_and_the_control_does_not(tmp_path):
    # A learning check with a fixed seed and the default budget (50k steps, about 12 s here): the bar
    # is a mean of 475 over the last 20 episodes (seed 1 is not one the defaults were chosen on). The memoryless
    # control, same budget, must stay far below: it measured 43 to 48 on seeds 1 to 3 (README.md),
    # Stable-Baselines3's memoryless PPO 40.5 (FACTS.md).
    means = {}
    for memory in ("lstm", "none"):
        P.train(P.parse_args(["--seed", "1", "--memory", memory, "--run-dir", str(tmp_path / memory)]))
        returns = np.loadtxt(tmp_path / memory / "episodes.csv", delimiter=",", skiprows=1)[:, 2]
        means[memory] = returns[-20:].mean()
    assert means["lstm"] >= 475, means
    assert means["none"] < 200, means


@pytest.mark.slow
def test_nonfinite_loss_stops_with_exit_1_and_keeps_the_last_good_checkpoint(tmp_path):
    out = run("--total-timesteps", "256", "--run-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    good = (tmp_path / "checkpoint.pt").read_bytes()
    out = run("--total-timesteps", "1024", "--learning-rate", "1e30", "--run-dir", str(tmp_path))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "non-finite loss in update" in out.stderr.strip().splitlines()[-1]
    assert (tmp_path / "checkpoint.pt").read_bytes() == good
