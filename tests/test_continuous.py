"""Checks of what only ppo_continuous.py has: its Gaussian and tanh-squashed policies, the truncation
bootstrap, the normalization statistics that travel with the checkpoint, and its command line."""
import csv
import subprocess
import sys
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import AffineTransform, Independent, Normal, TanhTransform, TransformedDistribution

from conftest import (ROOT, discounted_sums, load_script, plus_bootstraps, pooled_variance,
                      record_steps_and_the_agent)

P = load_script("ppo_continuous")
SMALL = ["--env-id", "Pendulum-v1", "--num-steps", "256", "--num-minibatches", "4", "--update-epochs", "2"]


def run(*argv, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "ppo_continuous.py"), *argv], capture_output=True,
                          text=True, timeout=timeout)


def read_csv(path):
    return list(csv.DictReader(open(path)))


def agent_for(space, squash, seed=0):
    torch.manual_seed(seed)
    envs = SimpleNamespace(single_observation_space=gym.spaces.Box(-1, 1, (3,)), single_action_space=space)
    agent = P.Agent(envs, SimpleNamespace(squash=squash))
    with torch.no_grad():  # a mean that is not near zero, so that the squash matters
        agent.actor_mean[-1].weight.normal_(0, 1.0)
        agent.obs_norm.mean.copy_(torch.tensor([1.0, -2.0, 0.5]))  # statistics far from (0, 1)
        agent.obs_norm.var.copy_(torch.tensor([4.0, 0.25, 1e-4]))
    return agent


def normalized(agent, x):
    """Raw observations as the networks must see them [cont-6, cont-7], by hand."""
    z = (x.double() - agent.obs_norm.mean) / (agent.obs_norm.var + 1e-8).sqrt()
    return z.clamp(-10, 10).float()


def test_the_agent_normalizes_raw_observations_itself():
    # The caller hands raw observations to get_value and get_action_and_value; both networks must see
    # them normalized with the agent's statistics, which those calls must not move.
    agent = agent_for(gym.spaces.Box(-2, 2, (2,)), squash=False)
    x = 3 * torch.randn(64, 3)
    z = normalized(agent, x)
    assert (z.abs() == 10).any() and not torch.allclose(z, x, atol=0.1)  # clipped, and far from raw
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    _, u, logprob, _, value = agent.get_action_and_value(x)
    torch.testing.assert_close(agent.get_value(x), agent.critic(z).squeeze(-1))
    torch.testing.assert_close(value, agent.critic(z).squeeze(-1))
    std = agent.actor_logstd.exp()
    torch.testing.assert_close(logprob, Independent(Normal(agent.actor_mean(z), std), 1).log_prob(u))
    assert all(torch.equal(v, agent.state_dict()[k]) for k, v in before.items())


def test_gaussian_log_prob_and_entropy_equal_torch_distributions():
    agent = agent_for(gym.spaces.Box(-2, 2, (2,)), squash=False)
    x, u = torch.randn(64, 3), 3 * torch.randn(64, 2)
    action, u_out, logprob, entropy, value = agent.get_action_and_value(x, u)
    dist = Independent(Normal(agent.actor_mean(normalized(agent, x)), agent.actor_logstd.exp()), 1)
    torch.testing.assert_close(logprob, dist.log_prob(u))
    torch.testing.assert_close(entropy, dist.entropy())
    # [cont-5] the env gets u clipped to the bounds; u itself, unclipped, is what is stored and scored
    assert torch.equal(u_out, u) and torch.equal(action, u.clamp(-2, 2)) and (u.abs() > 2).any()
    torch.testing.assert_close(value, agent.critic(normalized(agent, x)).squeeze(-1))


def test_squashed_log_prob_equals_transformed_distribution_and_stays_finite_at_the_bounds():
    low, high = np.array([-2.0, 0.0, -1.0], np.float32), np.array([2.0, 1.0, 3.0], np.float32)
    agent = agent_for(gym.spaces.Box(low, high), squash=True)
    x = torch.randn(512, 3)
    mean, std = agent.actor_mean(normalized(agent, x)).detach(), agent.actor_logstd.exp().detach()
    # samples across the range, many far out: at |u| = 8 an action is within 1e-6 of its bound
    u = (mean + std * torch.randn(512, 3) * torch.tensor([1.0, 4.0, 8.0])).clamp(-8, 8)
    action, u_out, logprob, entropy, _ = agent.get_action_and_value(x, u)
    # The reference in float64, where atanh(action) still recovers u this close to the bounds.
    scale, low64 = torch.as_tensor((high - low) / 2).double(), torch.as_tensor(low).double()
    reference = TransformedDistribution(Normal(mean.double(), std.double()),
                                        [TanhTransform(), AffineTransform(low64 + scale, scale)])
    y = low64 + scale * (torch.tanh(u.double()) + 1)
    torch.testing.assert_close(action.double(), y, rtol=1e-5, atol=1e-5)
    assert torch.equal(u_out, u)  # the rollout stores u, never atanh(action)
    torch.testing.assert_close(logprob.double(), reference.log_prob(y).sum(1), rtol=1e-4, atol=1e-3)
    assert (u.abs() > 5).any(1).sum() > 50  # the comparison did reach near the bounds
    # Beyond that, tanh(u) rounds to exactly +-1 in float32: the log-probability stays finite.
    far = torch.tensor([[9.0, -12.0, 30.0], [-40.0, 25.0, -9.5]])
    _, _, far_logprob, far_entropy, _ = agent.get_action_and_value(x[:2], far)
    assert torch.isfinite(far_logprob).all() and torch.isfinite(far_entropy).all()
    assert ((action >= torch.as_tensor(low)) & (action <= torch.as_tensor(high))).all()


def test_the_squashed_policys_entropy_is_the_gaussians_as_its_name_says():
    # The squashed entropy has no closed form, and log J at the stored sample would pass no gradient to the
    # bonus: the entropy logged and rewarded is the Gaussian's (of u), as the comment and README say. Near a
    # bound the squashed entropy is far lower: a Monte Carlo estimate with the mean at 2 and log std 2.
    agent = agent_for(gym.spaces.Box(-1, 1, (2,)), squash=True)
    with torch.no_grad():
        agent.actor_mean[-1].weight.zero_()
        agent.actor_mean[-1].bias.fill_(2.0)
        agent.actor_logstd.fill_(2.0)
    x = torch.randn(4096, 3)
    _, u, logprob, entropy, _ = agent.get_action_and_value(x)
    gaussian = Independent(Normal(torch.full((2,), 2.0), torch.full((2,), 2.0).exp()), 1).entropy()
    torch.testing.assert_close(entropy, gaussian.expand(4096))
    squashed = -logprob.mean()  # the sampled actions' own -log p(a): a Monte Carlo estimate
    assert squashed < gaussian - 5, (squashed, gaussian)


def test_squash_at_float32s_largest_bounds_stays_finite():
    # (high - low) / 2 overflowed to inf in float32 for bounds of -+3.4e38: log-probabilities of -inf.
    big = float(np.finfo(np.float32).max)
    agent = agent_for(gym.spaces.Box(-big, big, (2,), np.float32), squash=True)
    action, u, logprob, entropy, value = agent.get_action_and_value(torch.randn(64, 3))
    assert torch.isfinite(logprob).all() and torch.isfinite(action).all()
    # the action the log-probability is of: big * tanh(u), not the bound whenever u > 0
    torch.testing.assert_close(action, big * torch.tanh(u), rtol=1e-5, atol=0)


def test_squash_is_refused_for_bounds_tanh_cannot_map_onto(capsys):
    # tanh maps onto finite bounds, apart: infinite ones made the scale infinite and the actions NaN, and bounds
    # of zero width make its log -inf.
    for task, shown in [("ReachAnywhere-v0", "inf"), ("ReachAlongALine-v0", "[1. 0.]")]:
        with pytest.raises(SystemExit) as e:
            P.parse_args(["--env-id", f"tiny_tasks:{task}", "--squash"])
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert e.value.code == 2 and "--squash" in last and shown in last, last
        P.parse_args(["--env-id", f"tiny_tasks:{task}"])  # accepted without --squash (a refusal raises SystemExit)


@pytest.mark.slow
def test_truncation_bootstraps_from_the_final_observations_value(tmp_path, monkeypatch):
    # Pendulum always ends by truncation at step 200. The rewards that reach compute_gae at those steps
    # must be the scaled reward plus gamma * V(final observation); with truncation taken as termination
    # they would be the scaled reward alone, and this test fails.
    seen = record_steps_and_the_agent(P, monkeypatch)
    original_gae = P.compute_gae

    def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
        agent, steps = seen["agent"], seen["steps"][-len(rewards):]  # this rollout's steps
        raw = torch.tensor(np.array([s[0] for s in steps]), dtype=torch.float32)
        # The scale from every discounted sum so far, computed apart from the script's statistics.
        var = pooled_variance([discounted_sums(seen["steps"], gamma)])[0]
        torch.testing.assert_close(agent.return_norm.var, torch.tensor(var), rtol=1e-6, atol=0)
        scaled = (raw / torch.tensor(var + 1e-8).sqrt().float()).clamp(-10, 10)
        expected = plus_bootstraps(scaled, steps, agent, gamma)
        truncated = torch.tensor(np.array([s[2] for s in steps]))
        assert truncated.sum() == 2 and dones[1:][truncated[:-1]].eq(1).all()  # a done all the same
        assert (expected - scaled)[truncated].abs().min() > 1e-3  # the bootstrap is there, and not small
        torch.testing.assert_close(rewards, expected)  # and nowhere else, in this rollout or a later one
        seen["checked"] += 1
        return original_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda)

    monkeypatch.setattr(P, "compute_gae", compute_gae)
    # 3 rollouts of 256 steps: the truncations fall at steps 200, 144 and 88 of each rollout
    P.train(P.parse_args(["--env-id", "Pendulum-v1", "--num-envs", "2", "--num-steps", "256",
                          "--total-timesteps", "1536", "--run-dir", str(tmp_path)]))
    assert seen["checked"] == 3


@pytest.mark.slow
def test_update_starts_from_the_rollouts_numbers(tmp_path, monkeypatch):
    # The first minibatch of every update recomputes the stored log-probabilities and values: observations are
    # normalized the same way in the rollout and in the update, and the stored u is scored, not the clipped
    # action. Checked with and without the squash.
    original = P.ppo_loss
    for squash in ("--no-squash", "--squash"):
        calls = []
        def spy(**k):
            names = ["newlogprob", "oldlogprob", "advantages", "newvalue", "oldvalue"]
            calls.append([k[name].detach().clone() for name in names])
            return original(**k)
        monkeypatch.setattr(P, "ppo_loss", spy)
        run_dir = str(tmp_path / squash)
        P.train(P.parse_args([*SMALL, squash, "--total-timesteps", "768", "--run-dir", run_dir]))
        assert len(calls) == 3 * 2 * 4
        for call in calls:  # [core-7] each minibatch's advantages reach the loss with mean 0 and std 1
            assert abs(call[2].mean()) < 1e-5 and abs(call[2].std() - 1) < 1e-4
        for update in range(3):
            newlogprob, oldlogprob, _, newvalue, oldvalue = calls[update * 8]
            torch.testing.assert_close(newlogprob, oldlogprob, rtol=0, atol=1e-5)
            torch.testing.assert_close(newvalue, oldvalue, rtol=0, atol=1e-5)


def test_discrete_actions_are_refused_with_a_pointer_to_the_other_scripts(capsys):
    # The flags every script checks the same way are in test_cli.py.
    with pytest.raises(SystemExit) as e:
        P.parse_args(["--env-id", "CartPole-v1"])
    assert e.value.code == 2
    assert "ppo_lstm.py" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.slow
def test_run_outputs_same_seed_same_run_and_eval_gif(tmp_path):
    for name in ("a", "b"):
        out = run(*SMALL, "--total-timesteps", "1024", "--run-dir", str(tmp_path / name))
        assert out.returncode == 0, out.stderr
    updates = read_csv(tmp_path / "a" / "updates.csv")
    assert [int(r["global_step"]) for r in updates] == [256, 512, 768, 1024]
    lrs = [float(r["learning_rate"]) for r in updates]
    assert lrs == pytest.approx([3e-4 * f for f in (1, .75, .5, .25)])  # annealed linearly [core-4]
    ckpt = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    assert ckpt["script"] == "ppo_continuous" and ckpt["global_step"] == 1024 and ckpt["iteration"] == 4
    assert {"obs_norm.mean", "obs_norm.var", "return_norm.var"} <= set(ckpt["model"])
    for name in ("updates.csv", "episodes.csv"):  # all but the timing columns are equal
        rows = [read_csv(tmp_path / run_name / name) for run_name in ("a", "b")]
        for row in rows[0] + rows[1]:
            row.pop("sps", None), row.pop("wall_time", None)
        assert rows[0] == rows[1] and len(rows[0]) > 0, name
    gif = tmp_path / "episode"  # a GIF whatever the name: PIL would take the format from its extension
    out = run("--eval", str(tmp_path / "a" / "checkpoint.pt"), "--eval-episodes", "2", "--gif", str(gif))
    assert out.returncode == 0, out.stderr
    assert "2 episodes: " in out.stdout and gif.stat().st_size > 1000 and gif.read_bytes()[:4] == b"GIF8"
    (tmp_path / "broken.pt").write_bytes((tmp_path / "a" / "checkpoint.pt").read_bytes()[:300])
    out = run("--eval", str(tmp_path / "broken.pt"))
    assert out.returncode == 1 and "Traceback" not in out.stderr and "broken.pt" in out.stderr


@pytest.mark.slow
def test_eval_sees_the_training_normalization(tmp_path, monkeypatch):
    # An evaluated checkpoint normalizes observations with the statistics the training run saved, frozen.
    out = run(*SMALL, "--total-timesteps", "1024", "--run-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"]
    assert saved["obs_norm.count"] > 1000 and not torch.equal(saved["obs_norm.mean"], torch.zeros(3).double())
    seen, original = [], P.RunningNorm.forward
    def spy(self, x):
        seen.append((self.mean.clone(), self.var.clone(), self.count.clone()))
        return original(self, x)
    monkeypatch.setattr(P.RunningNorm, "forward", spy)
    P.evaluate(P.parse_args(["--eval", str(tmp_path / "checkpoint.pt"), "--eval-episodes", "2"]))
    assert len(seen) >= 200  # every step of the 200-step episodes
    for mean, var, count in seen:
        assert torch.equal(mean, saved["obs_norm.mean"]) and torch.equal(var, saved["obs_norm.var"])
        assert torch.equal(count, saved["obs_norm.count"])


@pytest.mark.slow
def test_learns_inverted_pendulum_and_the_reloaded_agent_scores_the_same(tmp_path):
    # A learning check with a fixed seed and step budget, the script's defaults otherwise: 61,440 steps
    # (30 updates, about 30 s here). An untrained policy balances for about 5 steps; 1000 is the most an
    # episode can last. Measured on a 2-core Intel Xeon with AVX-512, seeds 1-8: the first 20 episodes 7.7-11.3,
    # the last 20 all at 1000.0, so another CPU's path has room to go elsewhere. The checkpoint,
    # evaluated with its saved statistics, must balance as well as training did: the failure reported against
    # implementations that do not save the observation statistics.
    P.train(P.parse_args(["--env-id", "InvertedPendulum-v5", "--total-timesteps", "61440", "--seed", "1",
                          "--run-dir", str(tmp_path)]))
    returns = np.loadtxt(tmp_path / "episodes.csv", delimiter=",", skiprows=1)[:, 2]
    assert returns[:20].mean() < 100 and returns[-20:].mean() >= 950, (returns[:20].mean(), returns[-20:].mean())
    evaluated = P.evaluate(P.parse_args(["--eval", str(tmp_path / "checkpoint.pt"), "--eval-episodes", "10"]))
    assert evaluated.mean() >= 950, evaluated


@pytest.mark.parametrize("platform, backend", [("linux", "egl"), ("darwin", "glfw"), ("win32", "glfw")])
def test_a_mujoco_gif_draws_by_egl_on_linux_and_by_glfw_elsewhere(platform, backend, monkeypatch):
    # EGL draws with no display, but macOS has none: MUJOCO_GL=egl there made every MuJoCo --gif fail, where
    # GLFW (what a Mac draws with) works. A user's own MUJOCO_GL is kept.
    monkeypatch.setattr(P.sys, "platform", platform)
    monkeypatch.setenv("MUJOCO_GL", "osmesa")  # first set here, so that the end of the test restores it
    for own in [None, "osmesa"]:
        if own:
            monkeypatch.setenv("MUJOCO_GL", own)
        else:
            monkeypatch.delenv("MUJOCO_GL", raising=False)
        P.make_envs(P.Args(env_id="HalfCheetah-v5", gif="a.gif"), 1).close()  # made, not drawn
        assert P.os.environ["MUJOCO_GL"] == (own or backend)
