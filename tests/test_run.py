"""What a run promises in all four scripts, checked the same way: one writer per run folder, whole logs, a torn last
row dropped, a second Ctrl-C that ends at once, a task of the user's own as gymnasium makes it, and messages that
are true: one line for a bad flag, --help in whole sentences, a rounded-up budget said, one score."""
import copy
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch

import tiny_tasks  # noqa: F401  (registers the tests' own tasks)
from conftest import ROOT, SCRIPTS, InProcess, load_script, read_csv, run, stop_after_the_first_update

# Runs long enough to be caught while they train, with a checkpoint after every update (or generation).
LONG = {
    "ppo_atari": ["--num-envs", "4", "--num-steps", "64", "--total-timesteps", "40960", "--device", "cpu",
                  "--max-episode-frames", "2000"],  # --eval's games end soon, whatever the policy
    "ppo_continuous": ["--env-id", "Pendulum-v1", "--num-steps", "256", "--num-minibatches", "4",
                       "--update-epochs", "2", "--total-timesteps", "100000"],
    "ppo_lstm": ["--num-envs", "8", "--num-steps", "32", "--total-timesteps", "200000"],
    "ppo_evolve": ["--total-timesteps", "200000", "--evo-steps", "1024", "--pop-size", "2",
                   "--eval-episodes", "2"],
}
MODULES = {}


def module(name):
    return MODULES.setdefault(name, load_script(name))


def start(name, argv, cwd):
    # tiny_tasks, for module:id tasks; unbuffered, so a line printed can be read as the run goes on
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(ROOT / f"{name}.py"), *map(str, argv)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path, proc, rows=1):
    """Until the CSV at path has this many rows (or the checkpoint at path exists)."""
    deadline = time.time() + 300
    while not path.exists() or (path.suffix == ".csv" and len(read_csv(path)) < rows):
        assert time.time() < deadline and proc.poll() is None, "the run did not get going"
        time.sleep(0.1)


def children(pid):
    """The processes whose parent is pid."""
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


def gone(pids, seconds=20):
    deadline = time.time() + seconds
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.time() < deadline:
        time.sleep(0.1)
    return not any(os.path.exists(f"/proc/{pid}") for pid in pids)


def training(name, run_dir):
    """A LONG run, once its first checkpoint is written -> the process, and its children (the workers)."""
    proc = start(name, [*LONG[name], "--save-interval", "0", "--run-dir", run_dir], cwd=run_dir.parent)
    wait_for(run_dir / "checkpoint.pt", proc)
    return proc, children(proc.pid)


def whole_logs(run_dir):
    """Every CSV whole: no NUL bytes, every row as long as its header, steps never going back."""
    for path in run_dir.glob("*.csv"):
        text = path.read_text()
        assert "\0" not in text and text.endswith("\n"), path.name
        lines = text.splitlines()
        assert all(line.count(",") == lines[0].count(",") for line in lines), path.name
        steps = [int(line.split(",")[0]) for line in lines[1:]]
        assert steps == sorted(steps), path.name


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_one_writer_per_run_folder_and_a_kill_leaves_no_lock(name, tmp_path):
    run_dir = tmp_path / "run"
    first, workers = training(name, run_dir)  # workers: ppo_evolve's
    # A second writer (a --resume while the run trains) ends at once, naming the folder, and touches nothing.
    before = (run_dir / "args.json").read_bytes()
    second = run(name, "--resume", run_dir)
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
    assert second.stderr.strip().splitlines()[-1] == f"error: {run_dir}: another process is writing this run"
    assert (run_dir / "args.json").read_bytes() == before
    # --eval of the running run works.
    evaluated = run(name, "--eval", run_dir, "--eval-episodes", "2")
    assert evaluated.returncode == 0 and "2 episodes: " in evaluated.stdout, evaluated.stderr
    assert first.poll() is None  # still training
    # Killed, the run leaves no lock behind (nor, for ppo_evolve, a worker): a --resume goes on.
    first.kill()
    first.communicate()
    assert gone(workers), "a worker outlived the run"
    steps = torch.load(run_dir / "checkpoint.pt", weights_only=True)["global_step"]
    resumed = start(name, ["--resume", run_dir], cwd=tmp_path)
    deadline = time.time() + 300
    while torch.load(run_dir / "checkpoint.pt", weights_only=True)["global_step"] == steps:
        assert time.time() < deadline and resumed.poll() is None, resumed.communicate()
        time.sleep(0.2)
    resumed.send_signal(signal.SIGTERM)
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 143, stderr
    whole_logs(run_dir)


@pytest.mark.parametrize("name", SCRIPTS)
def test_importing_a_script_leaves_torchs_global_settings_as_they_were(name):
    # `import ppo_lstm as P` (the README's recipe) turned off the argument checks of every torch distribution in
    # the importer's process; a script changes such settings when it trains or plays, not when imported.
    settings = "(torch.distributions.Distribution._validate_args, torch.get_num_threads())"
    probe = f"import torch; before = {settings}; import {name}; print(before == {settings})"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", (out.stdout, out.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_a_second_ctrl_c_ends_at_once_and_the_last_checkpoint_stays_whole(name, tmp_path):
    run_dir = tmp_path / "run"
    proc, workers = training(name, run_dir)
    proc.send_signal(signal.SIGINT)
    # The second only once the run has said it heard the first (two sent close together may arrive as one).
    while "(again: at once)" not in (line := proc.stdout.readline()):
        assert line, "the run ended without saying it would stop"
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    # Killed by the signal (-2, which a shell shows as 130), not an exit after finishing the update or generation
    # under way (exit 130 from the script itself).
    assert proc.returncode == -signal.SIGINT
    assert gone(workers), "a worker outlived the run"
    torch.load(run_dir / "checkpoint.pt", weights_only=True)  # whole


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_the_first_update_saves_so_a_run_killed_in_its_first_minutes_can_go_on(name, tmp_path):
    # At the default --save-interval (300 s) the first checkpoint came only after 5 minutes: a run killed
    # before then left nothing to resume. Now the first update (ppo_evolve: generation 0) saves at once.
    run_dir = tmp_path / "run"
    proc = start(name, [*LONG[name], "--run-dir", run_dir], cwd=tmp_path)
    # The row after the first save: update 2's, or ppo_evolve's first member of generation 1.
    csv, rows = ("population.csv", 3) if name == "ppo_evolve" else ("updates.csv", 2)
    wait_for(run_dir / csv, proc, rows)
    proc.kill()
    proc.communicate()
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["global_step"] > 0
    evaluated = run(name, "--eval", run_dir, "--eval-episodes", "2")
    assert evaluated.returncode == 0 and "2 episodes: " in evaluated.stdout, evaluated.stderr


# Each script's small run, and the steps of its update (ppo_evolve: of its generation of 2 members).
SMALL = {"ppo_atari": ["--num-envs", "2", "--num-steps", "32", "--device", "cpu"],
         "ppo_continuous": ["--env-id", "Pendulum-v1", "--num-steps", "200", "--num-minibatches", "2",
                            "--update-epochs", "1"],
         "ppo_lstm": ["--num-envs", "2", "--num-steps", "32"],
         "ppo_evolve": ["--pop-size", "2", "--evo-steps", "128", "--num-steps", "16", "--eval-episodes", "2"]}
UPDATE = {"ppo_atari": 64, "ppo_continuous": 200, "ppo_lstm": 64, "ppo_evolve": 256}


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_torn_last_row_is_dropped_on_resume_with_a_line_saying_so(name, tmp_path, capsys, monkeypatch):
    P = module(name)
    if name == "ppo_evolve":
        monkeypatch.setattr(P, "ProcessPoolExecutor", InProcess)
    argv = [*SMALL[name], "--total-timesteps", str(2 * UPDATE[name]), "--run-dir", str(tmp_path)]
    P.train(P.parse_args(argv))
    name_csv = "population.csv" if name == "ppo_evolve" else "episodes.csv"
    kept = (tmp_path / "updates.csv").read_text()
    for csv in ("updates.csv", name_csv):
        with open(tmp_path / csv, "a") as f:
            f.write("123,4.5")  # a row cut short: no newline after it
    capsys.readouterr()
    P.train(P.parse_args(["--resume", str(tmp_path)]))  # the budget is spent: it only reopens the run
    out = capsys.readouterr().out
    assert out.count("cut to its whole rows at the checkpoint") == 2
    assert (tmp_path / "updates.csv").read_text() == kept
    text = (tmp_path / name_csv).read_text()  # whole rows, the torn one gone (Atari's: no game ended, empty)
    assert "123,4.5" not in text and (text == "" or text.endswith("\n"))
    assert (tmp_path / "curve.png").exists()


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_csv_cut_shorter_or_deleted_since_the_checkpoint_resumes_with_whole_rows(name, tmp_path, capsys,
                                                                                 monkeypatch):
    # Neither the CSVs nor the checkpoint are fsynced: a crash may lose a CSV's tail that the checkpoint counted,
    # and a user may delete a CSV. --resume appended new rows to the cut-off line (a row of too many fields),
    # or ended in a traceback for the deleted file; now each keeps its whole rows and the run goes on.
    P = module(name)
    if name == "ppo_evolve":
        monkeypatch.setattr(P, "ProcessPoolExecutor", InProcess)
    small = [*SMALL[name], "--total-timesteps", str(3 * UPDATE[name])]
    stop_after_the_first_update(P, [*small, "--run-dir", str(tmp_path)], monkeypatch)
    second = "population.csv" if name == "ppo_evolve" else "episodes.csv"
    headers = {csv: (tmp_path / csv).read_text().partition("\n")[0] for csv in ("updates.csv", second)}
    os.truncate(tmp_path / "updates.csv", os.path.getsize(tmp_path / "updates.csv") - 5)  # its last row torn
    os.remove(tmp_path / second)
    P.train(P.parse_args(["--resume", str(tmp_path)]))
    for csv in ("updates.csv", second):
        lines = (tmp_path / csv).read_text().splitlines()  # Atari's episodes.csv: no game has ended
        assert lines == [] or lines[0] == headers[csv], (csv, lines)  # a header first, the one it had
        assert all(line.count(",") == lines[0].count(",") for line in lines), (csv, lines)
    # The rows whole before the torn one, then those of the updates after the checkpoint, none twice: ppo_evolve's
    # members train one rollout of 128 steps a generation, and the torn row was generation 0's last.
    steps = [int(row["global_step"]) for row in read_csv(tmp_path / "updates.csv")]
    U = UPDATE[name]
    assert steps == ([128, 384, 512, 640, 768] if name == "ppo_evolve" else [2 * U, 3 * U]), steps


@pytest.mark.parametrize("name", ["ppo_atari", "ppo_continuous", "ppo_lstm"])
def test_a_resume_acts_with_the_saved_weights_and_statistics_and_steps_adam_from_its_saved_state(
        name, tmp_path, monkeypatch):
    # A resume that left the new agent's weights, its normalization statistics or Adam's moments as drawn went on
    # without a word: the steps and schedules were right, the learning started over. The resumed run's first
    # action must come from the checkpoint's state dict, its first update from the checkpoint's Adam state.
    P = module(name)
    stop_after_the_first_update(
        P, [*SMALL[name], "--total-timesteps", str(2 * UPDATE[name]), "--run-dir", str(tmp_path)], monkeypatch)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    seen, act, update = {}, P.Agent.get_action_and_value, P.update

    def first_act(agent, *args, **kwargs):
        seen.setdefault("model", {k: x.clone() for k, x in agent.state_dict().items()})
        return act(agent, *args, **kwargs)

    def first_update(agent, optimizer, *args):
        seen.setdefault("adam", copy.deepcopy(optimizer.state_dict()["state"]))
        return update(agent, optimizer, *args)
    monkeypatch.setattr(P.Agent, "get_action_and_value", first_act)
    monkeypatch.setattr(P, "update", first_update)
    P.train(P.parse_args(["--resume", str(tmp_path)]))
    assert any(key.startswith("obs_norm.") for key in seen["model"]) == (name != "ppo_atari")
    torch.testing.assert_close(seen["model"], ckpt["model"], rtol=0, atol=0)
    assert seen["adam"]  # a new Adam's state is empty
    torch.testing.assert_close(seen["adam"], ckpt["optimizer"]["state"], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_lstm", "ppo_evolve"])
def test_a_task_of_ones_own_is_found_from_the_folder_one_runs_in(name, tmp_path):
    # `python path/to/ppo_lstm.py --env-id my_tasks:Reach-v0`, run from the module's folder: the script's folder
    # is on sys.path and the current one was not (ModuleNotFoundError). args.json is JSON as the standard has
    # it: ppo_evolve.py wrote "target": Infinity for a task with no reward threshold.
    shutil.copy(ROOT / "tests" / "tiny_tasks.py", tmp_path / "my_tasks.py")
    budget = {"ppo_continuous": ["--num-steps", "64", "--num-minibatches", "2"],
              "ppo_lstm": ["--num-envs", "1", "--num-minibatches", "1", "--num-steps", "64"],
              "ppo_evolve": ["--pop-size", "2", "--num-envs", "1", "--num-steps", "32", "--evo-steps", "32",
                             "--eval-episodes", "1", "--workers", "1", "--max-episode-steps", "16"]}[name]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, str(ROOT / f"{name}.py"), "--env-id", "my_tasks:Reach-v0", *budget,
                          "--total-timesteps", "64", "--run-dir", "r"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    json.loads((tmp_path / "r" / "args.json").read_text(), parse_constant=refuse)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_lstm", "ppo_evolve"])
def test_a_task_with_no_render_mode_and_no_time_limit_trains_and_plays(name, tmp_path):
    # tiny_tasks:Reach-v0 is made as gymnasium.make makes it: its constructor takes no render_mode, and it has
    # no time limit, so the run caps its episodes at --max-episode-steps (1,000 by default) and says so.
    budget = {"ppo_continuous": ["--num-steps", "1000", "--num-minibatches", "4", "--total-timesteps", "3000"],
              "ppo_lstm": ["--num-envs", "1", "--num-minibatches", "1", "--num-steps", "500",
                           "--total-timesteps", "3000"],
              "ppo_evolve": ["--pop-size", "2", "--num-envs", "1", "--num-steps", "500", "--evo-steps", "1000",
                             "--total-timesteps", "4000", "--eval-episodes", "2"]}[name]
    run_dir = tmp_path / "run"
    proc = start(name, ["--env-id", "tiny_tasks:Reach-v0", *budget, "--run-dir", run_dir], cwd=tmp_path)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    assert stdout.splitlines()[0] == "tiny_tasks:Reach-v0 has no time limit: --max-episode-steps 1,000"
    lengths = {int(row["length"]) for row in read_csv(run_dir / "episodes.csv")}
    assert lengths == {1000}
    proc = start(name, ["--eval", run_dir, "--eval-episodes", "2"], cwd=tmp_path)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0 and "2 episodes: " in stdout, stderr


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_bad_flag_is_one_line_and_help_reads_as_sentences(name, capsys):
    P = module(name)
    for argv in (["--num-envs", "0"], ["--num-envs", "x"], ["--no-such-flag"]):
        with pytest.raises(SystemExit) as e:
            P.parse_args(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "usage" not in err, err  # no usage block above it
    with pytest.raises(SystemExit):
        P.parse_args(["--help"])
    out = capsys.readouterr().out
    first = " ".join(out.split("\n\n")[0].split())  # the docstring's first paragraph, whole
    assert first.endswith(".") and first.split(":")[0] in P.__doc__
    assert "()" not in out and "(default: )" not in out


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_budget_rounded_up_is_said_in_one_line(name, capsys, tmp_path, monkeypatch):
    P = module(name)
    argv = {"ppo_atari": ["--num-envs", "2", "--num-steps", "32", "--device", "cpu"],
            "ppo_continuous": ["--env-id", "Pendulum-v1", "--num-steps", "64", "--num-minibatches", "2",
                               "--update-epochs", "1"],
            "ppo_lstm": ["--num-envs", "2", "--num-steps", "32"],
            "ppo_evolve": ["--pop-size", "2", "--num-steps", "16", "--eval-episodes", "2", "--evo-steps", "100"]}
    if name == "ppo_evolve":
        monkeypatch.setattr(P, "ProcessPoolExecutor", InProcess)
    P.train(P.parse_args([*argv[name], "--total-timesteps", "100", "--run-dir", str(tmp_path)]))
    out = capsys.readouterr().out.splitlines()
    if name == "ppo_evolve":  # 8 envs x 16 steps: 128 steps a member, 256 a generation
        assert "--evo-steps rounded up to whole rollouts: 128 steps a member" in out
        assert "256 steps: --total-timesteps rounded up to whole generations" in out
    else:  # rollouts of 64 steps: 2 envs x 32, or 1 env x 64
        assert "128 steps: --total-timesteps rounded up to whole rollouts" in out
    assert "nan" not in out[-1] and ("episodes' score: " in out[-1] or " best fitness " in out[-1])
    # The closing line's command runs this script, wherever train() was called from (sys.argv[0] named pytest).
    assert f"python {ROOT / f'{name}.py'} --eval {tmp_path}" in out[-1]


@pytest.mark.parametrize("name", ["ppo_atari", "ppo_continuous", "ppo_lstm"])
def test_no_score_until_an_episode_ends(name, tmp_path, capsys):
    # 64 steps: no Breakout game (5 lives) and no Pendulum episode (200 steps) ends this soon.
    P = module(name)
    argv = {"ppo_atari": ["--num-envs", "2", "--device", "cpu"],
            "ppo_continuous": ["--env-id", "Pendulum-v1", "--num-minibatches", "2", "--update-epochs", "1"],
            "ppo_lstm": ["--env-id", "Pendulum-v1", "--num-envs", "1", "--num-minibatches", "1"]}[name]
    P.train(P.parse_args([*argv, "--num-steps", "64", "--total-timesteps", "64", "--run-dir", str(tmp_path)]))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # The score's measure first, so that "none" is not followed by "(the last 20 episodes)".
    assert "the last 20 episodes' score: none, no episode has ended yet;" in last and "nan" not in last


# Updates of 64 steps, one env; episodes (or, in Atari, games cut by the frame cap) end after 100 steps, so none
# has ended when the first update is done.
ONE_ENV = {
    "ppo_atari": ["--num-envs", "1", "--num-steps", "64", "--max-episode-frames", "400", "--device", "cpu"],
    "ppo_continuous": ["--env-id", "Pendulum-v1", "--max-episode-steps", "100", "--num-steps", "64",
                       "--num-minibatches", "2", "--update-epochs", "2"],
    "ppo_lstm": ["--env-id", "Pendulum-v1", "--max-episode-steps", "100", "--num-envs", "1", "--num-minibatches", "1",
                 "--num-steps", "64", "--update-epochs", "2"],
}


def stopped_after_the_first_update(P, argv, monkeypatch):
    """P.train(argv), stopped as SIGTERM stops it, once its first update is logged: exit 143."""
    log_update = P.Run.log_update

    def log_and_stop(run, *args, **kwargs):
        log_update(run, *args, **kwargs)
        run.stop = signal.SIGTERM

    with monkeypatch.context() as m:
        m.setattr(P.Run, "log_update", log_and_stop)
        with pytest.raises(SystemExit) as e:
            P.train(P.parse_args(argv))
    assert e.value.code == 143


@pytest.mark.parametrize("name", list(ONE_ENV))
def test_a_run_stopped_before_its_first_episode_ended_resumes_with_whole_csvs(name, tmp_path, monkeypatch):
    # The checkpoint records each CSV's length, and --resume cuts the file back to it: episodes.csv was still
    # empty, so the resumed run writes its header first (the row-parsing resume wrote an empty line instead).
    # The resumed run starts new episodes, which end 100 steps on, in its third update.
    P = module(name)
    stopped_after_the_first_update(P, [*ONE_ENV[name], "--total-timesteps", "256", "--run-dir",
                                       str(tmp_path)], monkeypatch)
    assert (tmp_path / "episodes.csv").read_text() == ""
    P.train(P.parse_args(["--resume", str(tmp_path)]))
    lines = (tmp_path / "episodes.csv").read_text().splitlines()
    assert lines[0] == "global_step,wall_time,return,length" and len(lines) >= 2, lines
    assert [row["global_step"] for row in read_csv(tmp_path / "updates.csv")] == ["64", "128", "192", "256"]
    whole_logs(tmp_path)


@pytest.mark.parametrize("name", list(ONE_ENV))
def test_a_resumed_run_draws_the_random_numbers_a_run_never_stopped_draws(name, tmp_path, monkeypatch):
    # The checkpoint holds torch's generators, so a resumed stretch draws on from where the run stopped (action
    # noise, minibatch orders), as a run never stopped does; restarting them from --seed replayed the run's
    # first numbers. The envs start new episodes on a resume, but they draw from generators of their own, and a
    # step of the policy draws as many numbers whatever it sees: the generators' states after each update are
    # those of a run never stopped.
    P = module(name)
    states, log_update = [], P.Run.log_update

    def logging(run, *args, **kwargs):
        log_update(run, *args, **kwargs)
        states.append(torch.get_rng_state())
    monkeypatch.setattr(P.Run, "log_update", logging)
    argv = [*ONE_ENV[name], "--total-timesteps", "128"]
    P.train(P.parse_args([*argv, "--run-dir", str(tmp_path / "straight")]))
    straight, states[:] = states[:], []
    stopped_after_the_first_update(P, [*argv, "--run-dir", str(tmp_path / "stopped")], monkeypatch)
    P.train(P.parse_args(["--resume", str(tmp_path / "stopped")]))
    assert len(straight) == len(states) == 2 and not torch.equal(straight[0], straight[1])
    assert torch.equal(states[0], straight[0]) and torch.equal(states[1], straight[1])


@pytest.mark.parametrize("name", list(ONE_ENV))
def test_a_run_reads_no_cuda_generator_and_a_resume_seeds_cuda_anew(name, tmp_path, monkeypatch):
    # Reading CUDA's generators starts CUDA on the GPUs it reads (on a GPU machine a CPU run's first checkpoint
    # would open a context on every GPU), and a run saved on a CPU may go on on a GPU: a CUDA generator restored
    # from such a checkpoint (none) or left at --seed replays the noise the run drew first. So no CUDA state is
    # saved, and a resume seeds CUDA's generator anew, with the seed plus the steps done.
    def starts_cuda(*args, **kwargs):
        raise AssertionError("a run read CUDA's random-number generators")
    monkeypatch.setattr(torch.cuda, "get_rng_state", starts_cuda)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", starts_cuda)
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed", seeded.append)
    P = module(name)
    argv = [*ONE_ENV[name], "--total-timesteps", "128", "--run-dir", str(tmp_path)]
    stopped_after_the_first_update(P, argv, monkeypatch)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert torch.equal(ckpt["rng"], torch.get_rng_state())
    assert seeded == []
    P.train(P.parse_args(["--resume", str(tmp_path)]))
    assert seeded == [1 + 64]  # --seed 1, one update of 64 steps done


@pytest.mark.parametrize("name", SCRIPTS)
def test_runs_started_in_the_same_second_get_folders_of_their_own(name, tmp_path, monkeypatch):
    # A sweep started with & in a shell: the same task and seed, other flags. The default folder was named by the
    # second, so the second run of a second found it taken and ended (exit 1 or 2, naming a flag it was not given).
    monkeypatch.chdir(tmp_path)
    P = module(name)
    folders = {P.parse_args(["--gamma", str(gamma)]).run_dir for gamma in [0.99, 0.98]}
    assert len(folders) == 2 and all(folder.startswith("runs/") for folder in folders)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_folder_a_run_left_without_a_checkpoint_says_so_and_what_to_do(name, tmp_path, capsys):
    # A run that crashed before its first save leaves logs and no checkpoint: --resume cannot go on from it,
    # so the refusal of --run-dir does not send the user there; with a checkpoint it names --resume.
    (tmp_path / "updates.csv").write_text("global_step,sps\n")
    for ckpt, says in [(False, "holds no run to go on from"), (True, f"--resume {tmp_path}")]:
        if ckpt:
            torch.save({}, tmp_path / "checkpoint.pt")
        with pytest.raises(SystemExit) as e:
            module(name).parse_args(["--run-dir", str(tmp_path)])
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert e.value.code == 2 and "--run-dir must be new or empty" in last and says in last, last
        assert ("--resume" in last) == ckpt


class Episodes:
    """A stand-in for a script's vector env, of the script's spaces: 3 episodes side by side that end after 2, 5
    and 3 steps, scoring 1 a step, and that go on scoring after their end, as an env that resets itself does."""

    def __init__(self, observation_space, action_space):
        self.num_envs, self.ends = 3, np.array([2, 5, 3])
        self.single_observation_space, self.single_action_space = observation_space, action_space

    def observe(self):
        space = self.single_observation_space
        return np.zeros((self.num_envs, *space.shape), space.dtype)

    def reset(self, seed=None, options=None):
        self.t = 0
        return self.observe(), {}

    def step(self, action):
        self.t += 1
        return self.observe(), np.ones(self.num_envs), self.t == self.ends, np.zeros(self.num_envs, bool), {}

    def close(self):
        pass


@pytest.mark.parametrize("name", ["ppo_atari", "ppo_continuous", "ppo_lstm"])  # ppo_evolve: its play()'s test
def test_eval_scores_each_episode_up_to_its_own_end(name, tmp_path, monkeypatch):
    # --eval plays one episode per env until the last has ended: an episode over scores no more, though its env
    # has reset itself and plays on.
    from gymnasium.spaces import Box, Discrete
    P = module(name)
    spaces = {"ppo_atari": (Box(0, 255, (4, 84, 84), np.uint8), Discrete(4)),
              "ppo_continuous": (Box(-1, 1, (3,), np.float32), Box(-1, 1, (1,), np.float32)),
              "ppo_lstm": (Box(-1, 1, (4,), np.float32), Discrete(2))}[name]
    monkeypatch.setattr(P, "make_envs", lambda *args, **kwargs: Episodes(*spaces))
    args = P.Args(eval=str(tmp_path / "checkpoint.pt"), eval_episodes=3, device="cpu")
    torch.save(dict(script=P.SCRIPT, format=P.FORMAT, model=P.Agent(Episodes(*spaces), args).state_dict()),
               args.eval)
    assert list(P.evaluate(args)) == [2, 5, 3]


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_save_that_fails_midway_leaves_the_last_checkpoint_whole(name, tmp_path, monkeypatch):
    # A checkpoint is written aside, then renamed over the last: a save that dies mid-write (a kill, a full
    # disk) leaves the one before whole. Here the second save writes a few bytes, then fails: the error ends the
    # run (ppo_evolve.py: in one line, exit status 1; the others: with its traceback).
    P = module(name)
    if name == "ppo_evolve":
        monkeypatch.setattr(P, "ProcessPoolExecutor", InProcess)
    saved, save = [], torch.save

    def failing(obj, f, *args, **kwargs):
        if not isinstance(f, (str, os.PathLike)):  # ppo_evolve.py's members, as bytes
            return save(obj, f, *args, **kwargs)
        saved.append(obj["global_step"])
        if len(saved) == 2:
            with open(f, "wb") as torn:
                torn.write(b"torn")
            raise OSError("No space left on device")
        return save(obj, f, *args, **kwargs)
    monkeypatch.setattr(torch, "save", failing)
    with pytest.raises((OSError, SystemExit)) as e:
        P.train(P.parse_args([*LONG[name], "--save-interval", "0", "--run-dir", str(tmp_path)]))
    assert "No space left" in str(e.value)
    assert len(saved) == 2 and torch.load(tmp_path / "checkpoint.pt", weights_only=True)["global_step"] == saved[0]


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_score_is_the_last_20_episodes_mean_or_the_best_fitness(name):
    P = module(name)
    run = types.SimpleNamespace(curve=[(100 * i, float(i)) for i in range(30)])  # (step, return or fitness)
    assert P.Run.shown_score(run) == ("29.0" if name == "ppo_evolve" else "19.5")  # the mean of 10 to 29


# Runs of two updates (ppo_evolve: generations) in which episodes end before the first is done.
TWO = {
    "ppo_atari": ["--num-envs", "4", "--num-steps", "128", "--max-episode-frames", "400", "--device", "cpu",
                  "--total-timesteps", "1024"],  # games cut at about 100 steps
    "ppo_continuous": ["--env-id", "Pendulum-v1", "--num-steps", "256", "--num-minibatches", "4",
                       "--update-epochs", "1", "--total-timesteps", "512"],
    "ppo_lstm": ["--num-envs", "8", "--num-steps", "32", "--total-timesteps", "512"],
    "ppo_evolve": ["--total-timesteps", "4096", "--evo-steps", "1024", "--pop-size", "2", "--eval-episodes", "2"],
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_resume_keeps_the_scores_so_far_and_the_runs_clock(name, tmp_path, monkeypatch):
    # The curve (each episode's return, or each member's fitness) goes on from the checkpoint's, and so do the
    # score and curve.png made from it; episodes.csv's wall_time goes on from the time the run had trained.
    P = module(name)
    if name == "ppo_evolve":
        monkeypatch.setattr(P, "ProcessPoolExecutor", InProcess)
    stop_after_the_first_update(P, [*TWO[name], "--save-interval", "0", "--run-dir", str(tmp_path)], monkeypatch)
    first = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    first["wall_time"] = 1000.0  # as if it had trained a while: a clock that restarted would show
    torch.save(first, tmp_path / "checkpoint.pt")
    P.train(P.parse_args(["--resume", str(tmp_path)]))
    last = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert first["curve"] and last["curve"][:len(first["curve"])] == first["curve"]
    assert len(last["curve"]) > len(first["curve"])
    later = [row for row in read_csv(tmp_path / "episodes.csv") if int(row["global_step"]) > first["global_step"]]
    assert later and min(float(row["wall_time"]) for row in later) >= 1000


@pytest.mark.parametrize("name", SCRIPTS)
def test_eval_takes_its_own_seed_episodes_deterministic_and_gif(name, tmp_path):
    # The flags --eval plays with are its own: they may differ from the run's; any other must not.
    P = module(name)
    path = tmp_path / "checkpoint.pt"
    torch.save(dict(script=P.SCRIPT, format=P.FORMAT, args=dataclasses.asdict(P.Args())), path)
    gif = str(tmp_path / "a.gif")
    args = P.parse_args(["--eval", str(path), "--seed", "7", "--eval-episodes", "3", "--deterministic", "--gif", gif])
    assert (args.seed, args.eval_episodes, args.deterministic, args.gif) == (7, 3, True, gif)
