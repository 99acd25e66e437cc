"""Checks of what only ppo_atari.py has, and short end-to-end runs of its command line."""
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import load_script, plus_bootstraps, read_csv, record_steps_and_the_agent
from conftest import run as run_script

P = load_script("ppo_atari")
TINY = ["--num-envs", "4", "--num-steps", "64", "--save-interval", "0"]  # 256 steps an update, saved every update


def run(*argv):
    return run_script("ppo_atari", *argv)


def test_the_network_is_the_nature_cnn_on_frames_scaled_to_0_1():
    # [atari-8, atari-9] Three convolutions (32 of 8x8, stride 4; 64 of 4x4, stride 2; 64 of 3x3, stride 1), then
    # 3136 -> 512, on frames divided by 255: a frame of 255s gives what a frame of ones does.
    import types
    agent = P.Agent(types.SimpleNamespace(single_action_space=gym.spaces.Discrete(4)), P.Args())
    convs = [(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding)
             for m in agent.network if isinstance(m, torch.nn.Conv2d)]
    assert convs == [(4, 32, (8, 8), (4, 4), (0, 0)), (32, 64, (4, 4), (2, 2), (0, 0)),
                     (64, 64, (3, 3), (1, 1), (0, 0))]
    assert (agent.network[-2].in_features, agent.network[-2].out_features) == (64 * 7 * 7, 512)
    frames = torch.full((2, 4, 84, 84), 255, dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(agent.features(frames), agent.network(torch.ones(2, 4, 84, 84)))


# --------------------------------------------------------------------------------- the environment
def test_env_id_spellings():
    for name in ("Breakout", "BreakoutNoFrameskip-v4", "ALE/Breakout-v5", "breakout"):
        assert P.rom_id(name) == "breakout"
    assert P.rom_id("MsPacman") == "ms_pacman" and P.rom_id("SpaceInvadersNoFrameskip-v4") == "space_invaders"
    assert P.rom_id("Breakfast") is None


def test_a_game_starts_at_frame_1_to_29_so_there_are_at_most_29_starts():
    # [atari-1] ale-py draws 0-29 no-ops at a reset (noop_max=30), the FIRE frame counting among them (a draw of 0
    # or 1 is FIRE alone), so a game starts at frame 1-29. With no sticky actions these are the only starts a
    # --deterministic eval can play: at most 29 different games.
    envs = P.make_envs(P.Args(), 16)
    frames = []
    for seed in range(0, 64, 16):  # 64 starts
        _, info = envs.reset(seed=seed)
        frames += info["episode_frame_number"].tolist()
    envs.close()
    assert set(frames) <= set(range(1, 30))
    assert len(set(frames)) >= 20  # of 29 (about 26 expected): the starts vary


def test_a_seed_past_ales_32_bits_is_refused_in_one_line(capsys):
    # ALE's seeds are int32 and the games' reset seed grows with the update: --seed 2147483641 ended in a
    # pybind traceback from ale-py once the run's resets passed 2**31.
    for seed in [2**31 - 7, 2**30 + 1]:
        with pytest.raises(SystemExit) as e:
            P.parse_args(["--seed", str(seed)])
        assert e.value.code == 2 and "--seed" in capsys.readouterr().err.strip().splitlines()[-1]
    assert P.parse_args(["--seed", str(2**30)]).seed == 2**30
    # The frame cap is an int32 in ale-py too: 2**31 ended in a TypeError from its constructor.
    with pytest.raises(SystemExit) as e:
        P.parse_args(["--max-episode-frames", str(2**31)])
    assert e.value.code == 2 and "--max-episode-frames" in capsys.readouterr().err.strip().splitlines()[-1]


def test_frames_equal_sb3_wrappers():
    """The script's games give the frames of SB3's MaxAndSkip + WarpFrame pipeline plus a 4-frame stack.

    The random parts of both pipelines (no-op starts, FIRE at reset) are switched off in both, so that the same
    action sequence must give the same pixels: every step, all four stacked frames, until the game ends."""
    import ale_py
    from stable_baselines3.common.atari_wrappers import MaxAndSkipEnv, WarpFrame
    gym.register_envs(ale_py)
    args = P.Args(env_id="Breakout")
    ours = P.make_envs(args, 1, noop_max=0, use_fire_reset=False)
    sb3 = gym.wrappers.FrameStackObservation(
        WarpFrame(MaxAndSkipEnv(gym.make("BreakoutNoFrameskip-v4"), skip=4), 84, 84), 4, padding_type="zero")
    obs, _ = ours.reset(seed=0)
    ref, _ = sb3.reset(seed=0)
    assert obs.shape == (1, 4, 84, 84) and obs.dtype == np.uint8
    assert np.array_equal(obs[0], ref[..., 0])
    rng = np.random.default_rng(0)
    for t in range(2000):
        action = int(rng.integers(0, 4))
        obs, reward, term, trunc, info = ours.step(np.array([action]))
        ref, ref_reward, ref_term, ref_trunc, _ = sb3.step(action)
        assert reward[0] == ref_reward, f"step {t}"
        if ref_term or ref_trunc:  # our game has already restarted: its last frames are in final_obs
            assert term[0] and np.array_equal(info["final_obs"][0], ref[..., 0])
            break
        assert np.array_equal(obs[0], ref[..., 0]), f"frames differ at step {t}"
    assert t > 50, "the game ended too soon to show anything"


class Recorder:
    """Wraps the script's vector env and keeps what the games really did, for an independent reckoning."""

    def __init__(self, envs):
        self.envs, self.steps = envs, []
        self.single_action_space = envs.single_action_space

    def reset(self, **kwargs):
        obs, info = self.envs.reset(**kwargs)
        self.lives = info["lives"].copy()
        return obs, info

    def step(self, actions):
        obs, reward, term, trunc, info = self.envs.step(actions)
        self.steps.append((reward.copy(), term.copy(), trunc.copy(), self.lives.copy(), info["lives"].copy()))
        self.lives = info["lives"].copy()
        return obs, reward, term, trunc, info

    def close(self):
        self.envs.close()


def test_rewards_reach_gae_as_their_sign_and_a_cut_game_adds_gamma_v_of_its_last_frames(tmp_path, monkeypatch):
    # [atari-6] Space Invaders scores 5 to 30 a hit. The rewards that reach compute_gae must be each step's sign,
    # plus gamma * V(the cut game's last frames) where the frame cap (400 frames, about 100 steps) cut a game,
    # and nothing else: a lost life or a game over adds nothing.
    seen = record_steps_and_the_agent(P, monkeypatch)
    original_gae = P.compute_gae

    def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
        agent, steps = seen["agent"], seen["steps"][-len(rewards):]  # this rollout's steps
        raw = torch.tensor(np.array([s[0] for s in steps]), dtype=torch.float32)
        term, trunc = (torch.tensor(np.array([s[i] for s in steps])) for i in (1, 2))
        expected = plus_bootstraps(raw.sign(), steps, agent, gamma)
        assert raw.abs().max() >= 5 and (trunc & ~term).any()  # the sign and the bootstrap both matter
        assert dones[1:][(term | trunc)[:-1]].eq(1).all()
        torch.testing.assert_close(rewards, expected, rtol=1e-5, atol=1e-5)
        seen["checked"] += 1
        return original_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda)

    monkeypatch.setattr(P, "compute_gae", compute_gae)
    P.train(P.Args(env_id="SpaceInvaders", total_timesteps=1024, num_envs=4, num_steps=128, device="cpu",
                   max_episode_frames=400, run_dir=str(tmp_path)))
    assert seen["checked"] == 2


@pytest.mark.slow
def test_life_loss_is_a_done_and_the_logged_score_is_the_unclipped_game(tmp_path, monkeypatch):
    # Space Invaders: 3 lives, rewards of 5 to 200 per step, so a clipped score would show.
    recorders = []
    make = P.make_envs
    monkeypatch.setattr(P, "make_envs", lambda *a, **k: recorders.append(Recorder(make(*a, **k))) or recorders[-1])
    args = P.Args(env_id="SpaceInvaders", total_timesteps=4096, num_envs=2, num_steps=256, save_interval=1e9,
                  run_dir=str(tmp_path))
    P.train(args)
    games, clipped_games, lost_lives = [], [], 0
    score, clipped, length = np.zeros(2), np.zeros(2), np.zeros(2, int)
    for reward, term, trunc, lives_before, lives_after in recorders[0].steps:
        score, clipped, length = score + reward, clipped + np.sign(reward), length + 1
        for i in range(2):
            if term[i] and lives_after[i] < lives_before[i]:
                lost_lives += 1  # a done for learning, and the same game goes on
            elif term[i] or trunc[i]:  # the game is over: the games report the next game's lives already
                games.append((float(score[i]), int(length[i])))
                clipped_games.append((float(clipped[i]), int(length[i])))
                score[i], clipped[i], length[i] = 0, 0, 0
    logged = [(float(r["return"]), int(r["length"])) for r in read_csv(tmp_path / "episodes.csv")]
    assert len(games) >= 2 and lost_lives >= 2 * len(games)
    assert sorted(logged) == sorted(games)  # whole games, with their true scores...
    assert sorted(logged) != sorted(clipped_games)  # ...which differ from the clipped ones the agent learns from


# --------------------------------------------------------------------------------- the command line
@pytest.mark.slow
def test_run_outputs_and_same_seed_same_run(tmp_path):
    for name in ("a", "b"):
        out = run("--total-timesteps", "1024", "--run-dir", str(tmp_path / name), *TINY)
        assert out.returncode == 0, out.stderr
    a = tmp_path / "a"
    assert json.load(open(a / "args.json"))["total_timesteps"] == 1024
    updates = read_csv(a / "updates.csv")
    assert [int(r["global_step"]) for r in updates] == [256, 512, 768, 1024]
    assert set(updates[0]) >= {"sps", "learning_rate", "clip_coef", "pg_loss", "v_loss", "entropy", "approx_kl",
                               "clipfrac", "explained_variance"}
    # the schedules: lr and clip range fall linearly from their start values, the same fraction for both
    assert [float(r["learning_rate"]) for r in updates] == pytest.approx([2.5e-4 * f for f in (1, .75, .5, .25)], rel=1e-5)
    assert [float(r["clip_coef"]) for r in updates] == pytest.approx([0.1 * f for f in (1, .75, .5, .25)], rel=1e-5)
    assert (a / "curve.png").stat().st_size > 1000
    ckpt = torch.load(a / "checkpoint.pt", weights_only=True)
    assert ckpt["script"] == "ppo_atari" and ckpt["global_step"] == 1024 and ckpt["iteration"] == 4
    assert set(ckpt) >= {"model", "optimizer", "args", "format"}
    for name in ("updates.csv", "episodes.csv"):  # all but the timing columns are equal
        rows = [read_csv(tmp_path / run_name / name) for run_name in ("a", "b")]
        for row in rows[0] + rows[1]:
            row.pop("sps", None), row.pop("wall_time", None)
        assert rows[0] == rows[1] and len(rows[0]) > 0, name


@pytest.mark.slow
def test_eval_with_gif_ends_for_a_policy_that_never_fires(tmp_path, monkeypatch):
    # A policy that never presses FIRE never gets the ball: only the frame cap ends its games, 2000 frames =
    # 500 steps. (An untrained policy played greedily may fire or not, by its seed: this one is made to wait.)
    out = run("--total-timesteps", "256", "--max-episode-frames", "2000", "--run-dir", str(tmp_path / "r"), *TINY)
    assert out.returncode == 0, out.stderr
    monkeypatch.setattr(P.Agent, "get_action_and_value", lambda agent, x, greedy: (torch.zeros(len(x), dtype=int),))
    steps, make_envs = [], P.make_envs

    def counted(*args, **kwargs):
        envs = make_envs(*args, **kwargs)
        step = envs.step
        envs.step = lambda action: steps.append(step(action)) or steps[-1]
        return envs
    monkeypatch.setattr(P, "make_envs", counted)
    gif = tmp_path / "game"  # a GIF whatever the name: PIL would take the format from its extension
    scores = P.evaluate(P.parse_args(["--eval", str(tmp_path / "r"), "--eval-episodes", "2", "--gif", str(gif)]))
    assert len(steps) == 500 and steps[-1][3].all() and not any(s[2].any() or s[3].any() for s in steps[:-1])
    assert list(scores) == [0, 0]
    from PIL import Image
    with Image.open(gif) as image:
        assert image.format == "GIF" and image.size == (252, 252)


@pytest.mark.slow
def test_update_starts_from_the_rollouts_numbers(tmp_path, monkeypatch):
    # The first minibatch of every update recomputes the log-probabilities and values the rollout stored:
    # before any step of the optimizer they must agree, or the ratio is not 1 where PPO assumes it is.
    calls, original = [], P.ppo_loss
    def spy(**k):  # the script passes keyword arguments
        names = ("newlogprob", "oldlogprob", "advantages", "newvalue", "oldvalue")
        calls.append([k[name].detach().clone() for name in names])
        return original(**k)
    monkeypatch.setattr(P, "ppo_loss", spy)
    P.train(P.Args(total_timesteps=512, run_dir=str(tmp_path), num_envs=4, num_steps=64))
    assert len(calls) == 2 * 4 * 4  # 2 updates x 4 epochs x 4 minibatches
    for call in calls:  # [core-7] each minibatch's advantages reach the loss with mean 0 and std 1
        assert abs(call[2].mean()) < 1e-5 and abs(call[2].std() - 1) < 1e-4
    for first in (calls[0], calls[16]):
        newlogprob, oldlogprob, _, newvalue, oldvalue = first
        torch.testing.assert_close(newlogprob, oldlogprob, rtol=0, atol=1e-5)
        torch.testing.assert_close(newvalue, oldvalue, rtol=0, atol=1e-5)
    assert not torch.allclose(calls[-1][0], calls[-1][1], rtol=0, atol=1e-7)  # later minibatches do move
