"""Checks of what only ppo_evolve.py has: copies, mutations and selection, any task of its action spaces, the
stopping target, and its command line."""
import copy
import dataclasses
import io
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import tiny_tasks  # noqa: F401  (registers the tests' own tasks)
from conftest import (ROOT, DisabledBar, InProcess, assert_advantages_normalized_per_minibatch,
                      assert_each_epoch_takes_every_row_once_in_a_new_order, load_script, measure_gradient_norms,
                      plus_bootstraps, record_steps_and_the_agent, spy_on_the_losses, spy_on_the_minibatches,
                      stop_after_the_first_update, train_to_the_end)

P = load_script("ppo_evolve")
ARGS = P.Args()
ENVS = P.make_envs(ARGS, 1)  # CartPole's spaces, for the networks
OBS_DIM = ENVS.single_observation_space.shape[0]


@pytest.fixture(autouse=True)
def members_train_in_this_process(monkeypatch):
    """P.train called here trains its members in the test's process (runs of the script itself use the pool)."""
    monkeypatch.setattr(P, "ProcessPoolExecutor", InProcess)


def run(*argv, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "ppo_evolve.py"), *argv], capture_output=True, text=True,
                          timeout=timeout)


def trained_member(id, fitness, lr=1e-3):
    """A member as train_member leaves it: weights and Adam state after a few optimizer steps, as bytes."""
    torch.manual_seed(id)
    member = dict(id=id, parent=-1, mutation="new", fitness=fitness, state=None,
                  hparams=dict(learning_rate=lr, ent_coef=0.01, clip_coef=0.2, gae_lambda=0.95))
    agent, optimizer = P.build(member, ENVS, ARGS)
    for _ in range(3):
        _, logprob, entropy, value = agent.get_action_and_value(torch.randn(32, OBS_DIM))
        optimizer.zero_grad()
        (value.pow(2).mean() - logprob.mean() - entropy.mean()).backward()
        optimizer.step()
    state = io.BytesIO()
    torch.save(dict(model=agent.state_dict(), adam=optimizer.state_dict()), state)
    return dict(member, state=state.getvalue())


def unpack(member):
    """The member's state: {"model": its agent's state dict, "adam": Adam's}."""
    return torch.load(io.BytesIO(member["state"]), weights_only=True)


def children(seeds=range(30)):
    """(parent, child) pairs made by next_generation."""
    pairs = []
    for seed in seeds:
        population = [trained_member(0, 10.0), trained_member(1, 20.0), trained_member(2, 30.0)]
        args = P.Args(seed=seed, pop_size=3, tournament_size=2)
        for child in P.next_generation(population, 1, args)[1:]:
            pairs.append((next(m for m in population if m["id"] == child["parent"]), child))
    return pairs


def test_every_member_has_the_same_network(tmp_path):
    # One generation of 4 members, 128 steps each: the checkpoint holds the first population, trained.
    P.train(P.parse_args(["--pop-size", "4", "--evo-steps", "128", "--num-steps", "16", "--total-timesteps",
                          "512", "--eval-episodes", "2", "--run-dir", str(tmp_path)]))
    population = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["population"]
    assert [(m["id"], m["parent"], m["mutation"]) for m in population] == [(i, -1, "new") for i in range(4)]
    shapes = [{k: v.shape for k, v in unpack(member)["model"].items()} for member in population]
    assert all(s == shapes[0] for s in shapes) and shapes[0]["actor.0.weight"] == (64, OBS_DIM)
    assert len({member["hparams"]["learning_rate"] for member in population}) == 4  # drawn apart
    for member in population:
        assert all(low <= member["hparams"][k] <= high for k, (low, high) in P.HPARAMS.items())


def test_the_first_members_draw_each_hyperparameter_log_uniformly_on_its_scale(tmp_path, monkeypatch):
    # Generation 0 of 400 members, not trained (a stand-in scores each 0). On its scale (GAE's lambda as
    # 1 - lambda, so from 0.01 to 0.1: half the members above 0.968), u = where a value lies between the log
    # bounds must be uniform on [0, 1]: the largest gap between its empirical CDF and u's own is under 1.95 /
    # sqrt(400), the Kolmogorov-Smirnov test's bound at the 0.1% level. Lambda drawn log-uniformly itself, as the
    # others are, would miss it: a gap of 0.31 for these 400.
    rows = {"episodes": [], "updates": [], "population": []}
    monkeypatch.setattr(P, "train_member", lambda member, steps, **_: (dict(member, fitness=0.0), rows))
    P.train(P.parse_args(["--pop-size", "400", "--total-timesteps", "1", "--run-dir", str(tmp_path)]))
    population = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["population"]
    for name, bounds in P.HPARAMS.items():
        low, high = np.log(sorted(P.on_scale(name, bound) for bound in bounds))
        u = np.sort([(np.log(P.on_scale(name, m["hparams"][name])) - low) / (high - low) for m in population])
        assert 0 <= u[0] and u[-1] <= 1, name
        gap = np.abs(np.arange(1, 401) / 400 - u).max()
        assert gap < 1.95 / 400 ** 0.5, (name, gap)


def test_a_copy_has_its_parents_weights_and_adam_state_and_its_own_learning_rate():
    pairs = [(p, c) for p, c in children() if c["mutation"] == "learning_rate"]
    assert pairs, "no learning-rate mutation in 30 seeds"
    for parent, child in pairs:
        assert child["hparams"]["learning_rate"] != parent["hparams"]["learning_rate"]
        agent, optimizer = P.build(child, ENVS, ARGS)
        parent_agent, parent_optimizer = P.build(parent, ENVS, ARGS)
        for (name, p), q in zip(agent.named_parameters(), parent_agent.parameters()):
            assert torch.equal(p, q), name
            for k in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(optimizer.state[p][k], parent_optimizer.state[q][k]), (name, k)
        # the saved state holds the parent's rate: set after the load, the copy steps with its own
        assert unpack(child)["adam"]["param_groups"][0]["lr"] == parent["hparams"]["learning_rate"]
        assert optimizer.param_groups[0]["lr"] == child["hparams"]["learning_rate"]


def test_envs_can_draw_only_for_a_gif():
    # A task given a render mode may do drawing work in every step (LunarLander adds a Box2D body per engine puff,
    # and steps 2.4 times slower), so training and fitness envs get none; --gif's get "rgb_array".
    for gif, mode in [("", None), ("game.gif", "rgb_array")]:
        envs = P.make_envs(P.Args(gif=gif), 2)
        assert [env.render_mode for env in envs.unwrapped.envs] == [mode, mode]
        envs.close()


def test_a_mutation_moves_one_hyperparameter_a_little_within_its_range():
    # A copy's mutated hyperparameter is its parent's x0.8 or x1.2, cut back into its range; GAE's lambda moves
    # through 1 - lambda, so that from inside its range it stays inside (x1.2 on 0.95 would jump past 1). The
    # copy's other hyperparameters are its parent's. Parents start in the middle of every range, then at its top.
    middle = {k: (low * high) ** 0.5 for k, (low, high) in P.HPARAMS.items()}
    top = {k: high for k, (low, high) in P.HPARAMS.items()}
    seen = set()  # (hyperparameter, moved up)
    for start in [middle, top]:
        for seed in range(40):
            population = [dict(trained_member(i, 10.0 * i), hparams=dict(start)) for i in range(3)]
            for child in P.next_generation(population, 1, P.Args(seed=seed, pop_size=3))[1:]:
                parent = population[child["parent"]]
                name = child["mutation"]
                low, high = P.HPARAMS[name]
                old, new = parent["hparams"][name], child["hparams"][name]
                moved = [1 - (1 - old) * f if name == "gae_lambda" else old * f for f in (0.8, 1.2)]
                assert new in [pytest.approx(float(np.clip(m, low, high))) for m in moved], name
                if start is middle:
                    assert low < new < high, name  # a small step from the middle stays inside
                    seen.add((name, new > old))
                others = {k: v for k, v in child["hparams"].items() if k != name}
                assert others == {k: v for k, v in parent["hparams"].items() if k != name}
    assert seen == {(name, up) for name in P.HPARAMS for up in (False, True)}


def test_the_elite_survives_a_generation_unchanged():
    population = [trained_member(i, fitness) for i, fitness in enumerate([5.0, 50.0, 20.0, 1.0])]
    before = copy.deepcopy(population[1])
    args = P.Args(seed=3, pop_size=4)
    new = P.next_generation(population, 1, args)
    elite = new[0]
    assert elite["id"] == 1 and elite["hparams"] == before["hparams"] and elite["fitness"] == 50.0
    assert elite["mutation"] == "elite" and elite["parent"] == before["parent"]  # its population.csv row
    assert elite["state"] == before["state"]  # its weights and Adam's state, byte for byte
    assert [m["id"] for m in new[1:]] == [5, 6, 7] and all(m["fitness"] == -float("inf") for m in new[1:])


def test_tournament_winners_are_the_fitter_members():
    # With tournaments of the whole population (drawn with replacement), most copies come from the fittest,
    # wherever it stands: last, or first, where the elite stands after a selection (it is drawn as the others).
    members = [trained_member(i, float(i)) for i in range(4)]
    for population in (members, members[::-1]):
        parents = []
        for seed in range(10):
            args = P.Args(seed=seed, pop_size=4, tournament_size=4)
            parents += [c["parent"] for c in P.next_generation(population, 1, args)[1:]]
        assert parents.count(3) > len(parents) / 2, parents  # member 3 is the fittest


def test_a_fitness_game_scores_its_own_episode_only():
    # The fitness games play side by side until the last has ended; a game that is over earns no more. On
    # CartPole (1 a step) each game's return is its length, and an untrained member's lengths differ.
    agent = P.build(trained_member(0, 0.0), ENVS, ARGS)[0]
    scores, lengths = P.play(agent, ARGS, range(8))
    assert (scores == lengths).all() and len(set(lengths)) > 1, (scores, lengths)


@pytest.mark.parametrize("argv,flag", [
    (["--pop-size", "0"], "--pop-size"),
    (["--evo-steps", "0"], "--evo-steps"),
    (["--tournament-size", "0"], "--tournament-size"),
    (["--env-id", "FrozenLake-v1"], "--env-id"),  # Discrete observations
    (["--env-id", "tiny_tasks:TupleActions-v0"], "--env-id"),  # a space no script here has
    (["--workers", "0"], "--workers"),
    (["--env-id", "no_such_module:Task-v0"], "--env-id"),
    (["--eval-episodes", "0"], "--eval-episodes"),
    (["--num-steps", "-1"], "--num-steps"),
    (["--seed", "-1"], "--seed"),
    (["--gamma", "1.5"], "--gamma"),
    (["--save-interval", "-1"], "--save-interval"),
    (["--max-grad-norm", "0"], "--max-grad-norm"),
    (["--total", "512"], "--total"),  # a prefix of --total-timesteps is refused
    (["--gif", "best.gif"], "--gif"),  # without --eval
    (["--learning-rate", "1e-3"], "--learning-rate"),  # evolved, not a flag
    (["--device", "cuda"], "--device"),  # the members train on the CPU
    (["--target", "nan"], "--target"),  # trained nothing and exited 0
    (["--target", "inf"], "--target"),
    (["--vf-coef", "nan"], "--vf-coef"),
    (["--seed", str(2**64)], "--seed"),  # torch.manual_seed overflowed
    (["--env-id", "tiny_tasks:ScalarBox-v0"], "--env-id"),  # a Box action of shape (): crashed
])
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        P.parse_args(argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err.strip().splitlines()[-1]


def test_workers_are_one_a_member_at_most_and_by_default_the_cores_this_process_may_use(tmp_path, monkeypatch):
    # More workers than members was refused, even with --eval, which starts none; now the pool is cut to one a
    # member (2**63 - 1 had overflowed in the pool). By default a process that taskset or a container's cpuset
    # limits to fewer cores than the machine has starts one worker per core it may use, not per core there is.
    assert P.parse_args(["--workers", "7"]).workers == 6
    assert P.parse_args(["--workers", str(2**63 - 1)]).workers == 6
    ckpt = dict(script=P.SCRIPT, format=P.FORMAT, args=dataclasses.asdict(P.Args(pop_size=2)))
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    assert P.parse_args(["--eval", str(tmp_path), "--workers", "8"]).workers == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert P.parse_args([]).workers == 2
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS and Windows have no affinity to read
    assert P.parse_args([]).workers == 6


TINY = ["--total-timesteps", "6144", "--evo-steps", "1024", "--pop-size", "3", "--eval-episodes", "4"]
UPDATE_COLUMNS = ("global_step,sps,learning_rate,clip_coef,pg_loss,v_loss,entropy,approx_kl,clipfrac,"
                  "explained_variance,member")
POPULATION_COLUMNS = ("global_step,eval_steps,generation,member,parent,mutation,fitness,learning_rate,ent_coef,"
                      "clip_coef,gae_lambda")


def read_csv(path):
    return np.atleast_1d(np.genfromtxt(path, delimiter=",", names=True, dtype=None, encoding=None))


def last_line(text):
    return text.strip().splitlines()[-1]


@pytest.mark.slow
def test_run_resume_eval_and_broken_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    out = run(*TINY, "--run-dir", str(run_dir))
    assert out.returncode == 0, out.stderr
    # One line: the folder, the best fitness and what it is, the command that plays the member kept anew.
    assert out.stdout.strip().splitlines() == [last_line(out.stdout)]
    assert last_line(out.stdout).startswith(f"{run_dir}: best fitness ")
    assert "luckiest" in last_line(out.stdout)
    # The command as it works from here: the script named as it was run (an absolute path, here).
    assert last_line(out.stdout).endswith(f"python {ROOT / 'ppo_evolve.py'} --eval {run_dir} --eval-episodes 100")
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)  # plain data only
    assert ckpt["format"] == P.FORMAT and ckpt["global_step"] == 6144 and len(ckpt["population"]) == 3
    rows = np.genfromtxt(run_dir / "population.csv", delimiter=",", names=True, dtype=None, encoding=None)
    assert (run_dir / "population.csv").read_text().splitlines()[0] == POPULATION_COLUMNS  # the lineage too
    assert len(rows) == 6 and list(rows["generation"]) == [0, 0, 0, 1, 1, 1]
    assert list(rows["global_step"]) == list(range(1024, 6145, 1024))
    assert (rows["eval_steps"] >= 4 * 8).all()  # each member's 4 fitness episodes, of 8 steps at least
    assert [m["fitness"] for m in ckpt["population"]] == list(rows["fitness"][3:])  # the last generation, scored
    elite = rows[:3][np.argmax(rows["fitness"][:3])]
    assert rows[3]["member"] == elite["member"] and rows[3]["learning_rate"] == elite["learning_rate"]
    for name in ("curve.png", "episodes.csv", "args.json"):
        assert (run_dir / name).stat().st_size > 0, name
    # updates.csv: one row per update (2 generations x 3 members x 1 rollout), the common columns, the member
    assert (run_dir / "updates.csv").read_text().splitlines()[0] == UPDATE_COLUMNS
    updates = read_csv(run_dir / "updates.csv")
    assert list(updates["global_step"]) == list(range(1024, 6145, 1024))
    assert list(updates["member"]) == list(rows["member"])  # the same members, in the same order
    assert np.allclose(updates["learning_rate"], rows["learning_rate"], rtol=1e-5)  # each its own rate, never annealed
    assert np.isfinite(updates["pg_loss"]).all() and (updates["entropy"] > 0).all()
    # A second run into the folder is refused, and changes nothing.
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    out = run(*TINY, "--run-dir", str(run_dir))
    assert out.returncode == 2 and "--run-dir" in last_line(out.stderr) and "--resume" in last_line(out.stderr)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    out = run("--resume", str(run_dir / "checkpoint.pt"), "--pop-size", "4")
    assert out.returncode == 2 and "--pop-size" in last_line(out.stderr)
    # --eval takes the checkpoint or its folder, and plays the fittest member ever scored.
    best = ckpt["best"]
    assert best["fitness"] == rows["fitness"].max()
    for path in (run_dir / "checkpoint.pt", run_dir):
        out = run("--eval", str(path), "--eval-episodes", "3")
        assert out.returncode == 0, out.stderr
        assert f"member {best['id']}, 3 episodes: " in out.stdout
    gif = tmp_path / "best"  # a GIF whatever the name: PIL would take the format from its extension
    out = run("--eval", str(run_dir), "--eval-episodes", "2", "--deterministic", "--gif", str(gif))
    assert out.returncode == 0 and "XDG_RUNTIME_DIR" not in out.stderr, out.stderr  # no display needed
    from PIL import Image
    with Image.open(gif) as image:
        assert image.format == "GIF" and gif.stat().st_size > 1000 and image.n_frames >= 8  # a CartPole episode lasts 8 steps at least
    for argv, flag in [(["--resume", str(run_dir)], "--resume"), (["--gif", str(tmp_path / "no" / "a.gif")], "--gif")]:
        out = run("--eval", str(run_dir), *argv)
        assert out.returncode == 2 and flag in last_line(out.stderr), out.stderr
    (tmp_path / "broken.pt").write_bytes((run_dir / "checkpoint.pt").read_bytes()[:200])
    for path in (tmp_path / "broken.pt", tmp_path / "missing.pt"):
        out = run("--eval", str(path))
        assert out.returncode == 1 and "Traceback" not in out.stderr and path.name in out.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(before)  # --eval writes nothing there


@pytest.mark.slow
def test_sigterm_saves_a_whole_generation_exits_143_and_a_moved_run_resumes(tmp_path):
    generation = 3 * 2048  # steps of a generation: 3 members x 2048
    argv = ["--total-timesteps", "30720", "--evo-steps", "2048", "--pop-size", "3", "--eval-episodes", "4",
            "--target", "1e9", "--save-interval", "0", "--run-dir", "runs/first"]
    (tmp_path / "work").mkdir()
    run_dir = tmp_path / "work" / "runs" / "first"
    proc = subprocess.Popen([sys.executable, str(ROOT / "ppo_evolve.py"), *argv], cwd=tmp_path / "work",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (run_dir / "checkpoint.pt").exists() and proc.poll() is None:
        time.sleep(0.1)  # the first checkpoint: generation 0, whole
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr  # as a shell reports a run ended by SIGTERM
    assert "stopping" in stdout and last_line(stdout) == "stopped; continue with --resume runs/first"
    stopped = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert stopped["global_step"] in [g * generation for g in range(1, 5)]  # whole generations only
    rows = read_csv(run_dir / "population.csv")
    assert rows["global_step"][-1] == stopped["global_step"]  # the generation under way was finished
    assert [m["fitness"] for m in stopped["population"]] == list(rows["fitness"][-3:])
    with open(run_dir / "updates.csv", "a") as f:  # a row written after the checkpoint: resume drops it
        f.write(f"{stopped['global_step'] + 1},1,1,1,1,1,1,1,1,1,99\n")
    # The folder moves; the run goes on where it lies now, from another working folder.
    moved = tmp_path / "elsewhere" / "first"
    moved.parent.mkdir()
    shutil.move(run_dir, moved)
    (tmp_path / "other").mkdir()
    out = subprocess.run([sys.executable, str(ROOT / "ppo_evolve.py"), "--resume", "../elsewhere/first"],
                         cwd=tmp_path / "other", capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert os.listdir(tmp_path / "other") == []
    assert last_line(out.stdout).startswith("../elsewhere/first: best fitness ")
    assert "--eval" in last_line(out.stdout)
    ckpt = torch.load(moved / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] == 30720
    rows = read_csv(moved / "population.csv")
    assert list(rows["generation"]) == [g for g in range(5) for _ in range(3)]  # none lost, none twice
    assert (np.diff(rows["global_step"]) == 2048).all()
    updates = read_csv(moved / "updates.csv")  # 2 updates per member and generation, none lost, none twice
    assert list(updates["global_step"]) == list(range(1024, 30721, 1024)) and 99 not in updates["member"]
    episodes = read_csv(moved / "episodes.csv")
    assert (np.diff(episodes["global_step"]) >= 0).all()
    # Members train side by side, each episode timed where it ends: wall_time goes on across the resume.
    last_generation = episodes["global_step"] > 30720 - generation
    assert episodes["wall_time"][last_generation].min() > episodes["wall_time"][:3].max()


@pytest.mark.slow
def test_the_fittest_member_ever_scored_is_kept_as_it_was_and_eval_plays_it(tmp_path, monkeypatch, capsys):
    # Fitness that falls after generation 0 stands in for a population that training makes worse: the member to
    # keep is generation 0's fittest (member 1, 30) with the weights it was scored with, not the elite that
    # trained on from it and then scored 5.
    scores = iter([10.0, 30.0, 20.0, 5.0, 1.0, 2.0])
    monkeypatch.setattr(P, "play", lambda *_: (np.array([next(scores)] * 4), np.array([8] * 4)))
    P.train(P.parse_args([*TINY, "--run-dir", str(tmp_path)]))
    assert last_line(capsys.readouterr().out).startswith(f"{tmp_path}: best fitness (the luckiest): 30.0;")
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    best, elite = ckpt["best"], ckpt["population"][0]
    assert (best["id"], best["fitness"], elite["id"], elite["fitness"]) == (1, 30.0, 1, 5.0)
    best, elite = unpack(best)["model"], unpack(elite)["model"]
    assert not all(torch.equal(best[k], v) for k, v in elite.items())
    out = run("--eval", str(tmp_path), "--eval-episodes", "2")
    assert out.returncode == 0 and last_line(out.stdout).startswith("member 1, 2 episodes: "), out.stderr


@pytest.mark.slow
def test_fitness_games_start_anew_each_generation_and_eval_plays_none_of_them(tmp_path, monkeypatch):
    # All members of a generation play the same starts; no two generations share one. --eval plays the first
    # seeds from its --seed on that no fitness game played, whatever its --seed and --eval-episodes: before, a
    # run's fitness games began at --seed + --eval-episodes, and --eval-episodes 100 replayed the very games the
    # kept member was chosen on.
    played, play = [], P.play

    def recording_play(agent, args, seeds):
        played.append(list(seeds))
        return play(agent, args, seeds)
    monkeypatch.setattr(P, "play", recording_play)
    P.train(P.parse_args([*TINY, "--seed", "7", "--run-dir", str(tmp_path)]))
    generation = read_csv(tmp_path / "population.csv")["generation"]
    assert len(played) == len(generation) == 6
    starts = {g: {tuple(s) for s, gen in zip(played, generation) if gen == g} for g in (0, 1)}
    assert all(len(starts[g]) == 1 for g in (0, 1))  # one set of 4 starts per generation
    fitness = {s for seeds in played for s in seeds}
    assert len(fitness) == 8  # 2 generations x 4 games, none shared
    for argv in [[], ["--eval-episodes", "100"], ["--seed", "12", "--eval-episodes", "20"], ["--seed", "500"]]:
        played.clear()
        P.evaluate(P.parse_args(["--eval", str(tmp_path), *argv]))
        (seeds,) = played
        first = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 1
        assert len(set(seeds)) == len(seeds) and seeds == sorted(seeds) and seeds[0] >= first, argv
        assert not set(seeds) & fitness, argv
    assert seeds == list(range(500, 510))  # seeds clear of the fitness games are --eval's own


@pytest.mark.slow
def test_every_update_steps_each_member_with_its_own_hyperparameters(tmp_path, monkeypatch):
    calls, loss = [], P.ppo_loss  # a spy: the clip range and entropy coefficient of every minibatch step
    monkeypatch.setattr(P, "ppo_loss", lambda **kw: calls.append((kw["clip_coef"], kw["ent_coef"])) or loss(**kw))
    lambdas, gae = [], P.compute_gae  # and GAE's lambda of every rollout, its last argument
    monkeypatch.setattr(P, "compute_gae", lambda *a: lambdas.append(a[-1]) or gae(*a))
    rates, update = [], P.update  # and the rate Adam steps with in every update
    monkeypatch.setattr(P, "update", lambda agent, adam, *a: rates.append(adam.param_groups[0]["lr"])
                        or update(agent, adam, *a))
    P.train(P.parse_args([*TINY, "--run-dir", str(tmp_path)]))
    assert len(calls) == 6 * 4 * 4  # 6 updates (2 generations x 3 members x 1 rollout), 4 epochs of 4 minibatches
    rows = read_csv(tmp_path / "population.csv")  # in the order the members trained
    expected = [(row["clip_coef"], row["ent_coef"]) for row in rows for _ in range(4 * 4)]
    assert np.allclose(calls, expected, rtol=1e-5)  # population.csv holds 6 digits
    for name, seen in (("gae_lambda", lambdas), ("learning_rate", rates)):  # one a member's rollout
        assert np.allclose(seen, [float(row[name]) for row in rows], rtol=1e-5), name
        assert len(set(seen)) > 1, name  # the members' values differ: a mix-up would show


@pytest.mark.parametrize("norm_adv", ["--norm-adv", "--no-norm-adv"])
def test_every_minibatch_loss_takes_the_flags_and_advantages_normalized_as_asked(norm_adv, tmp_path,
                                                                                   monkeypatch):
    # The value loss's flags, given values other than their defaults, reach every minibatch step (the clip
    # range and the entropy coefficient, each member's own, are checked above); a generation of 3 members.
    updates = spy_on_the_losses(P, monkeypatch)
    flags = [norm_adv, "--no-clip-vloss", "--vf-coef", "0.25"]
    args = P.parse_args([*TINY, *flags, "--total-timesteps", "3072", "--run-dir", str(tmp_path)])
    P.train(args)
    assert len(updates) == 3 and all(len(losses) == 4 * 4 for _, losses in updates)
    assert all((k["clip_vloss"], k["vf_coef"]) == (False, 0.25) for _, losses in updates for k in losses)
    assert_advantages_normalized_per_minibatch(updates, args)


def test_every_adam_step_takes_a_gradient_clipped_to_max_grad_norm(tmp_path, monkeypatch):
    # [core-11] As in the other scripts (test_cli.py): the whole gradient, the actor's and the critic's
    # together, is scaled down to --max-grad-norm before each step.
    norms = measure_gradient_norms(monkeypatch)
    P.train(P.parse_args([*TINY, "--max-grad-norm", "0.05", "--total-timesteps", "3072",
                          "--run-dir", str(tmp_path)]))
    assert len(norms) == 3 * 4 * 4 and max(norms) <= 0.05 * (1 + 1e-5), max(norms)
    assert sum(abs(n - 0.05) < 1e-6 for n in norms) > len(norms) / 2, norms


def test_a_cut_episode_bootstraps_from_its_final_observation_and_a_terminated_one_does_not(tmp_path,
                                                                                            monkeypatch):
    # Every episode of EndsAtItsLimit ends at its 16th step: by truncation alone, or terminated as well, which
    # is termination. The rewards that reach compute_gae must be the task's plus gamma * V(final observation)
    # at the steps truncated alone and nowhere else, in each of a member's 2 rollouts; every end is a done.
    seen = record_steps_and_the_agent(P, monkeypatch, training_only=True)
    original_gae = P.compute_gae

    def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
        agent, steps = seen["agent"], seen["steps"][-len(rewards):]  # this rollout's steps
        raw = torch.tensor(np.array([s[0] for s in steps]), dtype=torch.float32)
        term, trunc = (torch.tensor(np.array([s[i] for s in steps])) for i in (1, 2))
        expected = plus_bootstraps(raw, steps, agent, gamma)
        assert (trunc & ~term).any() and (trunc & term).any()  # both ends in this rollout
        assert dones[1:][(term | trunc)[:-1]].eq(1).all() and dones[1:].sum() == (term | trunc)[:-1].sum()
        assert (expected - raw)[trunc & ~term].abs().min() > 1e-4  # the bootstrap is there
        torch.testing.assert_close(rewards, expected)  # and nowhere else
        seen["checked"] += 1
        return original_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda)

    monkeypatch.setattr(P, "compute_gae", compute_gae)
    P.train(P.parse_args(["--env-id", "tiny_tasks:EndsAtItsLimit-v0", "--pop-size", "2", "--evo-steps", "2048",
                          "--total-timesteps", "4096", "--eval-episodes", "4", "--run-dir", str(tmp_path)]))
    assert seen["checked"] == 2 * 2  # 2 members, 2 rollouts each


def test_a_member_that_trains_on_draws_new_numbers_each_generation(tmp_path, monkeypatch):
    # A member's random numbers come from the run's seed, the generation and its id. The elite, and under
    # --no-evolve every member, keeps its id: its envs must not replay the same episodes each generation.
    seeds, make = [], P.make_envs

    def make_envs(args, num_envs):
        envs = make(args, num_envs)
        if num_envs == args.num_envs:  # a member's training envs, not its fitness games
            reset = envs.reset
            envs.reset = lambda seed=None, **options: seeds.append(seed) or reset(seed=seed, **options)
        return envs
    monkeypatch.setattr(P, "make_envs", make_envs)
    P.train(P.parse_args([*TINY, "--no-evolve", "--run-dir", str(tmp_path)]))
    assert len(seeds) == 2 * 3 and len(set(seeds)) == 2 * 3  # 2 generations of the same 3 members


def test_each_epoch_takes_every_row_of_the_rollout_once_in_a_new_order(tmp_path, monkeypatch):
    updates = spy_on_the_minibatches(P, monkeypatch)
    args = P.parse_args([*TINY, "--total-timesteps", "3072", "--run-dir", str(tmp_path)])
    P.train(args)
    assert len(updates) == 3  # a generation: 3 members of one rollout
    assert_each_epoch_takes_every_row_once_in_a_new_order(updates, args)


def test_a_resume_trains_the_saved_members_on(tmp_path, monkeypatch):
    # A resume must train the checkpoint's members from their saved weights and Adam state, not members drawn
    # anew: with --no-evolve, generation 1 builds exactly the members generation 0 left, in their order.
    stop_after_the_first_update(P, [*TINY, "--no-evolve", "--run-dir", str(tmp_path)], monkeypatch)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["population"]
    built, build = [], P.build
    monkeypatch.setattr(P, "build", lambda member, *a: built.append(member) or build(member, *a))
    P.train(P.parse_args(["--resume", str(tmp_path)]))
    assert [(m["id"], m["state"], m["hparams"]) for m in built] == [(m["id"], m["state"], m["hparams"])
                                                                    for m in saved]
    assert all(m["state"] for m in saved)  # trained members, not new ones


@pytest.mark.slow
def test_same_seed_same_run(tmp_path):
    for name in ("a", "b"):
        assert run(*TINY, "--run-dir", str(tmp_path / name)).returncode == 0
    assert (tmp_path / "a" / "population.csv").read_text() == (tmp_path / "b" / "population.csv").read_text()
    updates = [read_csv(tmp_path / run_dir / "updates.csv") for run_dir in "ab"]
    columns = [c for c in updates[0].dtype.names if c != "sps"]  # all but the speed
    assert (updates[0][columns] == updates[1][columns]).all()


@pytest.mark.slow
def test_nonfinite_loss_stops_with_exit_1_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    build = P.build

    def diverging_build(member, *rest):  # the children of generation 1 step at a rate of 1e30
        agent, optimizer = build(member, *rest)
        if member["id"] >= 3:
            optimizer.param_groups[0]["lr"] = 1e30
        return agent, optimizer

    monkeypatch.setattr(P, "build", diverging_build)
    with pytest.raises(SystemExit) as e:
        P.train(P.parse_args([*TINY, "--save-interval", "0", "--run-dir", str(tmp_path)]))
    message = str(e.value.code)
    assert message.startswith("error: ") and "non-finite weights, member 4" in message  # the elite trained first
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] == 3072  # generation 0, whole
    rows = read_csv(tmp_path / "population.csv")
    assert list(rows["generation"]) == [0, 0, 0, 1]
    assert [m["fitness"] for m in ckpt["population"]] == list(rows["fitness"][:3])
    assert len(read_csv(tmp_path / "updates.csv")) == 4 and (tmp_path / "curve.png").exists()



@pytest.mark.slow
def test_a_finite_loss_with_a_nonfinite_gradient_ends_the_run_before_the_member_is_kept(tmp_path, monkeypatch):
    # Every loss stays finite; member 4's last gradient step (its generation's one update, 16 steps, after
    # generation 0's 3 members and the elite) gets one nan, as a backward pass that overflows would give.
    original, calls = P.nn.utils.clip_grad_norm_, []

    def nan_gradient_of_member_4(parameters, *args, **kwargs):
        parameters = list(parameters)
        norm = original(parameters, *args, **kwargs)
        calls.append(1)
        if len(calls) == 5 * 16:
            parameters[0].grad[0, 0] = float("nan")  # Adam writes it into a weight
        return norm

    monkeypatch.setattr(P.nn.utils, "clip_grad_norm_", nan_gradient_of_member_4)
    with pytest.raises(SystemExit) as e:
        P.train(P.parse_args([*TINY, "--save-interval", "0", "--run-dir", str(tmp_path)]))
    assert str(e.value.code) == "error: FloatingPointError('non-finite weights, member 4')"
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] == 3072  # generation 0, whole
    scored = list(read_csv(tmp_path / "population.csv")["member"])
    assert len(scored) == 4 and 4 not in scored  # generation 0's three, then the elite (it trains first)


@pytest.mark.slow
def test_a_crash_mid_generation_leaves_the_last_whole_generations_checkpoint(tmp_path, monkeypatch):
    argv = ["--total-timesteps", "9216", "--evo-steps", "1024", "--pop-size", "3", "--eval-episodes", "4",
            "--save-interval", "0", "--run-dir", str(tmp_path)]  # 3 generations of 3072 steps
    played, play = [], P.play
    def crashing_play(*a, **kw):  # the 5th fitness game: the second member of the second generation
        played.append(1)
        if len(played) == 5:
            raise RuntimeError("a crash")
        return play(*a, **kw)
    monkeypatch.setattr(P, "play", crashing_play)
    with pytest.raises(SystemExit) as e:  # one line, exit 1
        P.train(P.parse_args(argv))
    assert str(e.value.code) == "error: RuntimeError('a crash')"
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] == 3072  # the first generation, whole; not the half-trained second
    rows = read_csv(tmp_path / "population.csv")
    assert list(rows["generation"]) == [0, 0, 0, 1]  # the second generation's first member was scored
    first = {row["member"]: row["fitness"] for row in rows[:3]}
    assert {m["id"]: m["fitness"] for m in ckpt["population"]} == pytest.approx(first)


@pytest.mark.slow
def test_learns_cartpole(tmp_path):
    # The default run, seed 1, stopped once the best fitness reaches 400: generation 0's best lies below it, and a
    # later generation's reaches it well inside the 614,400-step budget. A fixed seed takes another path on another
    # CPU (its floating-point sums differ), so the bar stands where seeds stand in for CPUs. Measured with
    # --target 1e9 (the whole budget, 10 generations) on a 2-core Intel Xeon with AVX-512, seeds 1-8: generation
    # 0's best 177-348; 400 first reached after 71,680-225,280 steps; the best of the run 474.8-500 (CartPole's
    # own 475 missed by seed 7). On a 2-core AMD EPYC with AVX2 only, seed 1: generation 0's best 282.9, the
    # best of the run 463.5, so 475 was never reached there.
    P.train(P.parse_args(["--seed", "1", "--target", "400", "--run-dir", str(tmp_path)]))
    rows = np.genfromtxt(tmp_path / "population.csv", delimiter=",", names=True, dtype=None, encoding=None)
    best = [rows["fitness"][rows["generation"] == g].max() for g in np.unique(rows["generation"])]
    assert best[0] < 400 <= best[-1] and rows["global_step"][-1] < 600_000, best


def test_the_default_budget_is_whole_generations_so_a_plain_run_says_nothing_was_rounded():
    # 600,000 steps were rounded up to 614,400 (10 generations of 6 members x 10,240), said in a line on every
    # plain `python ppo_evolve.py` as if the user had asked for something odd.
    args = P.Args()
    assert args.evo_steps % (args.num_envs * args.num_steps) == 0
    assert args.total_timesteps % (args.pop_size * args.evo_steps) == 0


def test_the_stopping_target_is_the_tasks_own_unless_given(tmp_path, monkeypatch):
    # CartPole-v1 registers a reward threshold of 475 and Acrobot-v1 of -100; tiny_tasks' MatchMultiBinary-v0
    # registers none, so its run trains the whole budget; --target overrides any. Seen where the loop compares
    # the best fitness with the target.
    compared = []

    class Fitness(float):
        def __lt__(self, target):
            compared.append(target)
            return False  # as if the target were reached: the run ends at once

    monkeypatch.setattr(P, "fittest", lambda members: dict(fitness=Fitness(0), id=0))
    cases = [("CartPole-v1", [], 475.0), ("Acrobot-v1", [], -100.0),
             ("tiny_tasks:MatchMultiBinary-v0", [], float("inf")), ("CartPole-v1", ["--target", "100"], 100.0)]
    for i, (env_id, target, expected) in enumerate(cases):
        P.train(P.parse_args(["--env-id", env_id, *target, "--run-dir", str(tmp_path / str(i))]))
        assert compared[-1] == expected, env_id


def test_a_stop_asked_in_the_generation_that_reaches_the_target_ends_as_a_finished_run(tmp_path, monkeypatch,
                                                                                       capsys):
    # The run has nothing left to do: exit 0 and the closing line, not 143 and "continue with --resume".
    log_generation = P.Run.log_generation

    def log_and_stop(run, state):  # SIGTERM, as its handler sets it, during the first generation
        log_generation(run, state)
        run.stop = signal.SIGTERM

    monkeypatch.setattr(P.Run, "log_generation", log_and_stop)
    # "--target=-1e9" with "=": argparse would take a separate "-1e9" for a flag. Any fitness reaches it.
    P.train(P.parse_args([*TINY, "--target=-1e9", "--run-dir", str(tmp_path)]))  # no SystemExit
    out = capsys.readouterr().out
    assert "--target -1000000000.0 reached" in out and "--resume" not in out and "best fitness" in out


@pytest.mark.parametrize("generation, status", [(0, 143), (1, 0)])
def test_a_stop_asked_in_the_last_generation_ends_as_a_finished_run(generation, status, tmp_path, monkeypatch,
                                                                    capsys):
    # SIGTERM, as its handler sets it, during generation 0 or 1 of 2 (no target reached). After generation 0
    # the run is cut short: exit 143 and "--resume". After the last one nothing is left to do: no SystemExit,
    # the closing line.
    log_generation = P.Run.log_generation

    def stop_during(run, state):
        if state["global_step"] == 3072 * (generation + 1):
            run.stop = signal.SIGTERM
        log_generation(run, state)

    monkeypatch.setattr(P.Run, "log_generation", stop_during)
    train_to_the_end(P, P.parse_args([*TINY, "--run-dir", str(tmp_path)]), status)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert ("--resume" in last) == bool(status) and ("--eval" in last) == (not status)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["global_step"] == 3072 * (generation + 1)


def test_with_the_bar_disabled_a_stop_in_the_last_generation_still_finishes(tmp_path, monkeypatch, capsys):
    # As TQDM_DISABLE=1 makes every bar: its update() counts nothing, and the exit status asks whether the
    # bar reached its end.
    monkeypatch.setattr(P, "tqdm", DisabledBar)
    log_generation = P.Run.log_generation

    def stop_during_the_last(run, state):
        if state["global_step"] == 6144:
            run.stop = signal.SIGTERM
        log_generation(run, state)

    monkeypatch.setattr(P.Run, "log_generation", stop_during_the_last)
    P.train(P.parse_args([*TINY, "--run-dir", str(tmp_path)]))  # no SystemExit
    assert "--eval" in capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["MatchMultiBinary-v0", "MatchMultiDiscrete-v0"])
def test_a_small_population_learns_a_multibinary_and_a_multidiscrete_task(tmp_path, task):
    # Tasks of the tests' own (tiny_tasks.py): each step shows a target action; the reward is the share of the
    # action's parts that match it, 16 steps an episode. A random policy earns 8 on MultiBinary(4) and 4.7 on
    # MultiDiscrete([3, 4]); 16 is the most. Seed 1, 4 members, 4 generations of 4,096 steps each, gamma 0.5 (the
    # reward is immediate). Measured on a 2-core Intel Xeon with AVX-512, seeds 1-4: the last generation's best
    # fitness 15.4-16.0 on MultiBinary and 15.9-16.0 on MultiDiscrete (the first generation's 9.7-13.9 and
    # 7.5-15.0: a bar on it would fall either side on another CPU).
    P.train(P.parse_args(["--env-id", f"tiny_tasks:{task}", "--gamma", "0.5", "--pop-size", "4",
                          "--evo-steps", "4096", "--total-timesteps", "65536", "--eval-episodes", "4",
                          "--run-dir", str(tmp_path)]))
    rows = read_csv(tmp_path / "population.csv")
    best = [rows["fitness"][rows["generation"] == g].max() for g in range(4)]
    assert best[-1] >= 14, best


@pytest.mark.slow
def test_one_worker_or_two_the_same_run(tmp_path):
    # Members train side by side in worker processes (--workers); what is random in a member comes from the
    # seed, its generation and its id, so the run's logs are the same whatever the number of workers.
    for workers in ("1", "2"):
        out = run(*TINY, "--workers", workers, "--run-dir", str(tmp_path / workers))
        assert out.returncode == 0, out.stderr
    one, two = tmp_path / "1", tmp_path / "2"
    assert (one / "population.csv").read_text() == (two / "population.csv").read_text()
    for name, clock in [("episodes.csv", "wall_time"), ("updates.csv", "sps")]:
        rows = [read_csv(folder / name) for folder in (one, two)]
        columns = [c for c in rows[0].dtype.names if c != clock]
        assert len(rows[0]) == len(rows[1]) > 0 and (rows[0][columns] == rows[1][columns]).all(), name


@pytest.mark.slow
def test_a_members_error_ends_the_run_in_one_line_and_no_worker_outlives_it(tmp_path):
    # tiny_tasks:Broken-v0 raises in its 100th step, inside a worker: the run ends with one line, exit 1.
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, str(ROOT / "ppo_evolve.py"), "--env-id", "tiny_tasks:Broken-v0",
                                 *TINY, "--workers", "2", "--run-dir", str(tmp_path / "run")],
                                stdout=subprocess.DEVNULL, stderr=err, env=env)
        # The pool's processes (not multiprocessing's resource tracker), looked for while the run goes on:
        # on a busy machine they may start seconds after the parent.
        workers, give_up = set(), time.time() + 300  # a hang fails the test, not the suite
        while proc.poll() is None:
            if time.time() > give_up:
                proc.kill()
                pytest.fail("the run did not end after its member's error")
            found = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "spawn_main"], capture_output=True,
                                   text=True).stdout.split()
            workers.update(int(pid) for pid in found)
            time.sleep(0.05)
    stderr = (tmp_path / "stderr").read_text()
    assert proc.returncode == 1 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == "error: RuntimeError('the task broke')"
    deadline = time.time() + 20
    while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.time() < deadline:
        time.sleep(0.1)
    assert workers and not any(os.path.exists(f"/proc/{pid}") for pid in workers)


def test_a_members_error_spares_the_callers_own_processes(tmp_path):
    # A program that calls train() may have processes of its own (a multiprocessing Manager, DataLoader workers):
    # on an error the run ended every child of the process, those too. Here the members train in this process.
    own = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    own.start()
    try:
        with pytest.raises(SystemExit) as e:
            P.train(P.parse_args(["--env-id", "tiny_tasks:Broken-v0", *TINY, "--run-dir", str(tmp_path)]))
        assert e.value.code == "error: RuntimeError('the task broke')"
        assert own.is_alive()
    finally:
        own.kill()
        own.join()


def catches_sigterm(pid):
    """Whether the process has a handler for SIGTERM (Linux: the SigCgt mask of /proc/PID/status)."""
    caught = re.search(r"SigCgt:\s*(\w+)", open(f"/proc/{pid}/status").read()).group(1)
    return int(caught, 16) >> (signal.SIGTERM - 1) & 1 == 1


@pytest.mark.slow
def test_ctrl_c_to_the_whole_group_as_the_workers_start_stops_the_run_as_asked(tmp_path):
    # A terminal's Ctrl-C reaches every process of its group. Sent while the workers were still starting (before
    # their initializer ignored it), it made them print tracebacks and the run end with exit 1
    # (BrokenProcessPool), leaving no checkpoint; now the workers ignore it from their first instruction.
    proc = subprocess.Popen([sys.executable, str(ROOT / "ppo_evolve.py"), *TINY, "--workers", "2",
                             "--run-dir", str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # its own group, as a terminal's job
    give_up = time.time() + 300
    workers = ["pgrep", "-P", str(proc.pid), "-f", "spawn_main"]
    # Until both workers run and the parent catches SIGTERM again (in the moment it starts them it ignores
    # Ctrl-C and SIGTERM, as they do: a Ctrl-C then is lost, and a second one stops the run).
    while len(subprocess.run(workers, capture_output=True).stdout.split()) < 2 or not catches_sigterm(proc.pid):
        assert time.time() < give_up and proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)  # the workers are still importing torch
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert out.strip().splitlines()[-1] == f"stopped; continue with --resume {tmp_path / 'run'}"
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["global_step"] == 3072


@pytest.mark.slow
def test_a_small_population_learns_a_box_task(tmp_path):
    # tiny_tasks:Reach-v0 (Box actions, no time limit: 16 steps here): each step shows a target point in
    # [-1, 1]^2 and the reward is minus the distance from the action to it. A policy blind to its observation
    # does best at the centre: -0.77 a step, -12.2 an episode. Fitness plays the mean action (--deterministic).
    # Seed 1, 4 members, 2 generations of 4,096 steps. Measured on a 2-core Intel Xeon with AVX-512, seeds 1-4:
    # the second generation's best fitness -0.9 to -2.8 (seed 1: -1.1, then -0.9).
    P.train(P.parse_args(["--env-id", "tiny_tasks:Reach-v0", "--max-episode-steps", "16", "--gamma", "0.5",
                          "--pop-size", "4", "--evo-steps", "4096", "--total-timesteps", "32768",
                          "--eval-episodes", "4", "--deterministic", "--run-dir", str(tmp_path)]))
    rows = read_csv(tmp_path / "population.csv")
    assert (rows["fitness"][rows["generation"] == 1] > -6).any()  # it reads its observation


@pytest.mark.slow
def test_a_population_of_32_trains_under_the_usual_limit_of_1024_open_files(tmp_path):
    # Members cross between processes as bytes: a tensor sent through a process pool is shared memory with an
    # open file each, and with the old population, the new and the member kept alive together a population of 8
    # died in its first generation at this limit (BrokenProcessPool).
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    argv = ["--pop-size", "32", "--num-envs", "8", "--num-steps", "16", "--evo-steps", "128",
            "--total-timesteps", "8192", "--eval-episodes", "2", "--workers", "2", "--run-dir", str(tmp_path / "r")]
    out = subprocess.run([sys.executable, str(ROOT / "ppo_evolve.py"), *argv], capture_output=True, text=True,
                         timeout=600, preexec_fn=limited)
    assert out.returncode == 0, out.stderr[-2000:]
    assert list(read_csv(tmp_path / "r" / "population.csv")["generation"]) == [0] * 32 + [1] * 32
