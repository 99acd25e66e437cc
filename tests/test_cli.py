"""Every script's command line, checked the same way: bad flag values, broken checkpoints, run folders that
are never overwritten, SIGTERM and Ctrl-C with their exit statuses, resume from a moved folder, a non-finite
loss. What only one script has is in its own test file."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import (ROOT, SCRIPTS, DisabledBar, assert_advantages_normalized_per_minibatch,
                      assert_each_epoch_takes_every_row_once_in_a_new_order, load_script,
                      measure_gradient_norms, read_csv, run, spy_on_the_losses, spy_on_the_minibatches, stop_after_the_first_update,
                      train_to_the_end)

# A few updates of 256 environment steps each, with a checkpoint after every update.
SMALL = {
    "ppo_atari": ["--num-envs", "4", "--num-steps", "64", "--save-interval", "0"],
    "ppo_continuous": ["--env-id", "Pendulum-v1", "--num-steps", "256", "--num-minibatches", "4",
                       "--update-epochs", "2", "--save-interval", "0"],
    "ppo_lstm": ["--num-envs", "8", "--num-steps", "32", "--save-interval", "0"],
}
PPO = list(SMALL)  # ppo_evolve: its own tests cover these paths
MODULES = {}


def module(name):
    return MODULES.setdefault(name, load_script(name))


def parse(name, argv):
    return module(name).parse_args(argv)


# Each case: the command line and the flag its one-line answer must name. A case whose flag a script does
# not have (ppo_evolve evolves its learning rate, for one) is skipped for that script.
BAD = [
    (["--num-envs", "0"], "--num-envs"),
    (["--total-timesteps", "-5"], "--total-timesteps"),
    (["--num-minibatches", "3"], "--num-minibatches"),  # divides no default batch
    # A minibatch of one row (its advantages have no std): 4 envs x 1 step in 4 minibatches.
    (["--num-envs", "4", "--num-steps", "1", "--num-minibatches", "4"], "--num-minibatches"),
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--device", "tpu"], "--device"),
    (["--gif", "game.gif"], "--gif"),  # without --eval
    (["--seed", "-1"], "--seed"),
    (["--gamma", "1.5"], "--gamma"),
    (["--gamma", "nan"], "--gamma"),
    (["--gae-lambda", "-1"], "--gae-lambda"),
    (["--max-grad-norm", "-1"], "--max-grad-norm"),
    (["--learning-rate", "nan"], "--learning-rate"),
    (["--learning-rate", "inf"], "--learning-rate"),
    (["--save-interval", "-5"], "--save-interval"),
    (["--vf-coef", "nan"], "--vf-coef"),  # accepted, then a non-finite loss after the folder was made
    (["--ent-coef", "nan"], "--ent-coef"),
    (["--ent-coef", "-1"], "--ent-coef"),
    (["--vf-coef", "inf"], "--vf-coef"),
    (["--seed", str(2**64)], "--seed"),  # overflowed torch.manual_seed: a traceback
    (["--num-envs", str(2**64)], "--num-envs"),  # overflowed an index: a traceback
    (["--num-steps", str(2**63)], "--num-steps"),
    (["--total", "512"], "--total"),  # a prefix of --total-timesteps is not taken for it
    (["--env", "Acrobot-v1"], "--env"),
]


# ppo_evolve.py evolves the rate, the entropy bonus and GAE's lambda, and its members train on the CPU.
ABSENT = {"ppo_evolve": {"learning_rate", "ent_coef", "gae_lambda", "device"}}


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("argv,flag", BAD)
def test_a_bad_flag_value_exits_2_naming_the_flag_and_makes_nothing(name, argv, flag, capsys, tmp_path,
                                                                    monkeypatch):
    # A flag the script does not have is refused the same way (argparse: unrecognized arguments); which ones
    # those are is said, so that a flag renamed fails here instead of passing as unknown.
    field = argv[0][2:].replace("-", "_")
    if flag != "--total" and flag != "--env":
        assert (field in module(name).Args.__annotations__) == (field not in ABSENT.get(name, ())), field
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        parse(name, argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err.strip().splitlines()[-1]
    assert os.listdir(tmp_path) == []  # no run folder, no stray file (MuJoCo once left its log here)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_run_dir_that_holds_a_run_is_refused(name, tmp_path, capsys):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "args.json").write_text("{}")
    (tmp_path / "old" / "checkpoint.pt").write_text("")
    with pytest.raises(SystemExit) as e:
        parse(name, ["--run-dir", str(tmp_path / "old")])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "--run-dir" in last and "--resume" in last
    assert parse(name, ["--run-dir", str(tmp_path / "new" / "run")]).run_dir.endswith("run")


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_run_dir_that_is_a_file_or_under_one_is_refused(name, tmp_path, capsys):
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "episodes.csv").write_text("global_step,wall_time,return,length\n")
    for run_dir in [tmp_path / "a_file", tmp_path / "a_file" / "run", tmp_path / "old"]:
        with pytest.raises(SystemExit) as e:
            parse(name, ["--run-dir", str(run_dir)])
        assert e.value.code == 2
        assert "--run-dir" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_broken_checkpoint_is_one_line_and_exit_1(name, tmp_path):
    good = tmp_path / "good.pt"
    torch.save(dict(script=name, format=module(name).FORMAT, model={}), good)
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    torch.save(dict(script="ppo_other", format=module(name).FORMAT), tmp_path / "sibling.pt")
    (tmp_path / "truncated.pt").write_bytes(good.read_bytes()[:100])
    (tmp_path / "text.pt").write_text("hello")
    for case in ("missing.pt", "foreign.pt", "sibling.pt", "truncated.pt", "text.pt"):
        with pytest.raises(SystemExit) as e:  # a message as the exit code: printed, exit status 1
            module(name).load_checkpoint(str(tmp_path / case))
        message = e.value.code
        assert isinstance(message, str) and message.startswith("error: ") and case in message
        assert "\n" not in message


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_a_broken_checkpoint_on_the_command_line_has_no_traceback(name, tmp_path):
    (tmp_path / "bad.pt").write_bytes(b"\x80\x02not a checkpoint")
    for flag in ("--eval", "--resume"):
        out = run(name, flag, tmp_path / "bad.pt")
        assert out.returncode == 1 and "Traceback" not in out.stderr and "bad.pt" in out.stderr


def start(name, argv, cwd):
    return subprocess.Popen([sys.executable, str(ROOT / f"{name}.py"), *map(str, argv)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_updates(proc, run_dir, count):
    deadline = time.time() + 300
    while not (run_dir / "updates.csv").exists() or len(read_csv(run_dir / "updates.csv")) < count:
        assert time.time() < deadline and proc.poll() is None, "the run did not get going"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("name", PPO)
def test_sigterm_saves_exits_143_and_a_moved_run_resumes_where_it_lies(name, tmp_path):
    run_dir = tmp_path / "work" / "runs" / "first"
    (tmp_path / "work").mkdir()
    argv = [*SMALL[name], "--total-timesteps", "3072", "--run-dir", "runs/first"]  # 12 updates
    proc = start(name, argv, cwd=tmp_path / "work")
    wait_for_updates(proc, run_dir, 3)  # in Atari the first game ends in update 3
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr  # as a shell reports a run ended by SIGTERM
    assert "stopping" in stdout + stderr and f"--resume runs/first" in stdout.strip().splitlines()[-1]
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)  # plain data only
    rows = read_csv(run_dir / "updates.csv")
    assert 2 <= ckpt["iteration"] < 12 and ckpt["global_step"] == int(rows[-1]["global_step"])
    last_wall_time = float(read_csv(run_dir / "episodes.csv")[-1]["wall_time"])

    # A second run into the folder is refused, and every file stays as it was.
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    out = run(name, *argv[:-2], "--run-dir", run_dir)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--resume" in out.stderr.strip().splitlines()[-1]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before

    # The folder moves; the run goes on where it lies now, from another working folder.
    moved = tmp_path / "elsewhere" / "first"
    moved.parent.mkdir()
    shutil.move(run_dir, moved)
    other = tmp_path / "other"
    other.mkdir()
    out = subprocess.run([sys.executable, str(ROOT / f"{name}.py"), "--resume", "../elsewhere/first",
                          "--seed", "2"], cwd=other, capture_output=True, text=True)
    refusal = out.stderr.strip().splitlines()[-1]  # names the run's own value, and why it must stay
    assert out.returncode == 2 and "--seed must be the checkpoint's, 1 (as the run began)" in refusal
    out = subprocess.run([sys.executable, str(ROOT / f"{name}.py"), "--resume", "../elsewhere/first",
                          "--device", "cpu"], cwd=other, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert os.listdir(other) == [] and not (tmp_path / "work" / "runs" / "first").exists()
    last = out.stdout.strip().splitlines()[-1]
    assert "../elsewhere/first" in last and "--eval" in last  # the folder, the score, how to evaluate
    rows = read_csv(moved / "updates.csv")
    assert [int(r["global_step"]) for r in rows] == list(range(256, 3073, 256))  # none lost or twice
    lr = float(rows[0]["learning_rate"])  # the schedule carried on where it stopped
    expected = [lr * (1 - i / 12) for i in range(12)]
    assert [float(r["learning_rate"]) for r in rows] == pytest.approx(expected, rel=1e-5)
    assert torch.load(moved / "checkpoint.pt", weights_only=True)["global_step"] == 3072
    episodes = read_csv(moved / "episodes.csv")
    times = [float(r["wall_time"]) for r in episodes]
    assert times == sorted(times) and times[-1] > last_wall_time  # wall_time goes on across the resume

    # --eval takes the folder; with --resume, or with a GIF into a missing folder, it is refused.
    for argv, flag in [(["--resume", moved], "--resume"), (["--gif", tmp_path / "no" / "a.gif"], "--gif")]:
        out = run(name, "--eval", moved, *argv)
        assert out.returncode == 2 and flag in out.stderr.strip().splitlines()[-1], out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SMALL))
def test_ctrl_c_saves_and_exits_130(name, tmp_path):
    proc = start(name, [*SMALL[name], "--total-timesteps", "20480", "--run-dir", tmp_path / "run"],
                 cwd=tmp_path)
    wait_for_updates(proc, tmp_path / "run", 1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in stderr
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["iteration"] >= 1


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("update, status", [(4, 143), (5, 0)])
def test_a_stop_asked_in_the_last_update_ends_as_a_finished_run(name, update, status, tmp_path, monkeypatch,
                                                                 capsys):
    # SIGTERM, as its handler sets it, while update 4 or 5 of 5 runs. After update 4 the run is cut short:
    # exit 143 and "continue with --resume". After the last one nothing is left to do: no SystemExit, the
    # closing line (it said 143 and "--resume", and a resume trained nothing).
    P = load_script(name)
    log_update = P.Run.log_update

    def stop_during(run, global_step, state, **row):
        if global_step == 256 * update:
            run.stop = signal.SIGTERM
        log_update(run, global_step, state, **row)

    monkeypatch.setattr(P.Run, "log_update", stop_during)
    train_to_the_end(P, P.parse_args([*SMALL[name], "--total-timesteps", "1280", "--run-dir", str(tmp_path)]),
                     status)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert ("--resume" in last) == bool(status) and ("--eval" in last) == (not status)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["iteration"] == update


@pytest.mark.parametrize("name", list(SMALL))
def test_with_the_bar_disabled_it_still_counts_each_update_and_a_stop_in_the_last_still_finishes(
        name, tmp_path, monkeypatch, capsys):
    # The Run reads the step count of the update before from the bar: sps is (global_step - bar.n) over the
    # update's time, and the exit status asks whether the bar reached its end. A disabled bar's update()
    # counted nothing: sps counted from the run's start, and a stop in the last update was reported as 143.
    # So the bar must hold the steps of the update before at each update's row.
    P = load_script(name)
    monkeypatch.setattr(P, "tqdm", DisabledBar)
    log_update, counted = P.Run.log_update, []

    def stop_during_the_last(run, global_step, state, **row):
        counted.append(run.bar.n)
        if global_step == 1280:
            run.stop = signal.SIGTERM
        log_update(run, global_step, state, **row)

    monkeypatch.setattr(P.Run, "log_update", stop_during_the_last)
    P.train(P.parse_args([*SMALL[name], "--total-timesteps", "1280", "--run-dir", str(tmp_path)]))  # exit 0
    assert counted == [0, 256, 512, 768, 1024]
    assert "--eval" in capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.parametrize("name", list(SMALL))
def test_every_adam_step_takes_a_gradient_clipped_to_max_grad_norm(name, tmp_path, monkeypatch):
    # [core-11] The whole gradient, all the agent's parameters together, is scaled down to --max-grad-norm before
    # each step. At 0.05 almost every raw gradient is longer: the steps see norms of 0.05, none above.
    P = load_script(name)
    norms = measure_gradient_norms(monkeypatch)
    P.train(P.parse_args([*SMALL[name], "--max-grad-norm", "0.05", "--total-timesteps", "512",
                          "--run-dir", str(tmp_path)]))
    assert norms and max(norms) <= 0.05 * (1 + 1e-5), max(norms)
    assert sum(abs(n - 0.05) < 1e-6 for n in norms) > len(norms) / 2, norms


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("norm_adv", ["--norm-adv", "--no-norm-adv"])
def test_every_minibatch_loss_takes_the_flags_and_advantages_normalized_as_asked(name, norm_adv, tmp_path,
                                                                                   monkeypatch):
    # The loss's flags, given values other than their defaults, reach every minibatch step of both updates;
    # ppo_atari.py's clip range anneals with the rate: 0.15 in the first of 2 updates, 0.075 in the second.
    P = load_script(name)
    updates = spy_on_the_losses(P, monkeypatch)
    flags = [norm_adv, "--no-clip-vloss", "--vf-coef", "0.25", "--ent-coef", "0.02", "--clip-coef", "0.15"]
    args = P.parse_args([*SMALL[name], *flags, "--total-timesteps", "512", "--run-dir", str(tmp_path)])
    P.train(args)
    assert len(updates) == 2
    for i, (_, losses) in enumerate(updates):
        clip_coef = 0.15 * (1 - i / 2) if name == "ppo_atari" else 0.15
        assert len(losses) == args.update_epochs * args.num_minibatches
        for k in losses:
            assert (k["clip_vloss"], k["vf_coef"], k["ent_coef"]) == (False, 0.25, 0.02)
            assert k["clip_coef"] == pytest.approx(clip_coef)
    assert_advantages_normalized_per_minibatch(updates, args)


@pytest.mark.parametrize("name", list(SMALL))
def test_a_resumed_run_starts_new_episodes_seeded_past_its_first(name, tmp_path, monkeypatch):
    # The envs' first reset takes --seed (env i: seed + i); a run resumed after its first update starts new
    # episodes, seeded past those (seed + num_envs), rather than replaying the starts the run began with.
    P = load_script(name)
    seeds, make = [], P.make_envs

    def make_envs(*args, **kwargs):
        envs = make(*args, **kwargs)
        reset = envs.reset

        def recorded(seed=None, **options):
            seeds.append(seed)
            return reset(seed=seed, **options)
        envs.reset = recorded
        return envs
    monkeypatch.setattr(P, "make_envs", make_envs)
    argv = [*SMALL[name], "--seed", "5", "--total-timesteps", "768", "--run-dir", str(tmp_path)]
    num_envs = P.parse_args(argv).num_envs
    stop_after_the_first_update(P, argv, monkeypatch)
    P.train(P.parse_args(["--resume", str(tmp_path)]))
    assert seeds == [5, 5 + num_envs], seeds


@pytest.mark.parametrize("name", list(SMALL))
def test_each_epoch_takes_every_row_of_the_rollout_once_in_a_new_order(name, tmp_path, monkeypatch):
    P = load_script(name)
    updates = spy_on_the_minibatches(P, monkeypatch)
    args = P.parse_args([*SMALL[name], "--total-timesteps", "512", "--run-dir", str(tmp_path)])
    P.train(args)
    assert_each_epoch_takes_every_row_once_in_a_new_order(updates, args)


@pytest.mark.parametrize("name", list(SMALL))
def test_a_nonfinite_loss_stops_with_exit_1_and_keeps_the_last_good_checkpoint(name, tmp_path,
                                                                              monkeypatch):
    # The third update's loss is made non-finite; the checkpoint of the second must stay as it was.
    P = load_script(name)
    original, calls = P.ppo_loss, []
    minibatches = {"ppo_atari": 4 * 4, "ppo_continuous": 2 * 4, "ppo_lstm": 8 * 2}[name]

    def broken_in_update_3(*args, **kwargs):
        calls.append(1)
        loss, stats = original(*args, **kwargs)
        return (loss * float("nan") if len(calls) > 2 * minibatches else loss), stats

    monkeypatch.setattr(P, "ppo_loss", broken_in_update_3)
    args = P.parse_args([*SMALL[name], "--total-timesteps", "1280", "--run-dir", str(tmp_path)])
    with pytest.raises(SystemExit) as e:
        P.train(args)
    assert "non-finite weights after update 3" in str(e.value.code) and str(e.value.code).startswith("error")
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["iteration"] == 2
    assert len(read_csv(tmp_path / "updates.csv")) == 2 and (tmp_path / "curve.png").exists()


@pytest.mark.parametrize("name", list(SMALL))
def test_a_finite_loss_with_a_nonfinite_gradient_stops_before_its_weights_are_saved(name, tmp_path,
                                                                                    monkeypatch):
    # Every loss stays finite; the last gradient step of update 3 gets one nan in its gradient, as a
    # finite loss whose backward pass overflows would give. Adam writes it into a weight.
    P = load_script(name)
    original, calls = P.nn.utils.clip_grad_norm_, []
    minibatches = {"ppo_atari": 4 * 4, "ppo_continuous": 2 * 4, "ppo_lstm": 8 * 2}[name]

    def nan_gradient_in_update_3(parameters, *args, **kwargs):
        parameters = list(parameters)
        norm = original(parameters, *args, **kwargs)
        calls.append(1)
        if len(calls) == 3 * minibatches:  # the last step of update 3
            grad = parameters[0].grad
            grad[(0,) * grad.dim()] = float("nan")  # its first element
        return norm

    monkeypatch.setattr(P.nn.utils, "clip_grad_norm_", nan_gradient_in_update_3)
    args = P.parse_args([*SMALL[name], "--total-timesteps", "1280", "--run-dir", str(tmp_path)])
    with pytest.raises(SystemExit) as e:
        P.train(args)
    assert len(calls) == 3 * minibatches  # no step after it
    assert "non-finite weights after update 3" in str(e.value.code) and str(e.value.code).startswith("error")
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["iteration"] == 2 and all(x.isfinite().all() for x in saved["model"].values())


