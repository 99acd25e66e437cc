"""Every script's command line, checked the same way: bad flag values, broken checkpoints, SIGTERM and
--resume, a non-finite loss. What only one script has is in its own test file."""
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, SCRIPTS, load_script, read_csv, run

# A few updates of 256 environment steps each, with a checkpoint after every update.
SMALL = {
    "ppo_atari": ["--num-envs", "4", "--num-steps", "64", "--save-interval", "0"],
    "ppo_continuous": ["--env-id", "Pendulum-v1", "--num-steps", "256", "--num-minibatches", "4",
                       "--update-epochs", "2", "--save-interval", "0"],
    "ppo_lstm": ["--num-envs", "8", "--num-steps", "32", "--save-interval", "0"],
}
PPO = list(SMALL)  # ppo_evolve checkpoints whole generations: its own tests cover those paths
MODULES = {}


def parse(name, argv):
    MODULES.setdefault(name, load_script(name))
    return MODULES[name].parse_args(argv)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("argv,flag", [
    (["--num-envs", "0"], "--num-envs"),
    (["--total-timesteps", "-5"], "--total-timesteps"),
    (["--num-minibatches", "3"], "--num-minibatches"),  # divides no default batch
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--device", "tpu"], "--device"),
    (["--gif", "game.gif"], "--gif"),  # without --eval
])
def test_a_bad_flag_value_exits_2_naming_the_flag(name, argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        parse(name, argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("name", SCRIPTS)
def test_an_unwritable_run_dir_exits_2(name, tmp_path, capsys):
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(SystemExit) as e:
        parse(name, ["--run-dir", str(tmp_path / "a_file" / "run")])
    assert e.value.code == 2
    assert "--run-dir" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_broken_checkpoint_is_one_line_and_exit_1(name, tmp_path):
    module = MODULES.setdefault(name, load_script(name))
    good = tmp_path / "good.pt"
    torch.save(dict(script=name, format=module.FORMAT, model={}), good)
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    torch.save(dict(script="ppo_other", format=module.FORMAT), tmp_path / "sibling.pt")
    (tmp_path / "truncated.pt").write_bytes(good.read_bytes()[:100])
    (tmp_path / "text.pt").write_text("hello")
    for case in ("missing.pt", "foreign.pt", "sibling.pt", "truncated.pt", "text.pt"):
        with pytest.raises(SystemExit) as e:  # a message as the exit code: printed, exit status 1
            module.load_checkpoint(str(tmp_path / case))
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


@pytest.mark.slow
@pytest.mark.parametrize("name", PPO)
def test_sigterm_saves_and_resume_continues(name, tmp_path):
    run_dir = tmp_path / "run"
    argv = [*SMALL[name], "--total-timesteps", "3072", "--run-dir", str(run_dir)]  # 12 updates
    proc = subprocess.Popen([sys.executable, str(ROOT / f"{name}.py"), *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (run_dir / "updates.csv").exists() or len(read_csv(run_dir / "updates.csv")) < 2:
        assert time.time() < deadline and proc.poll() is None, "the run did not get going"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=300)
    assert proc.returncode == 0
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)  # plain data only
    rows = read_csv(run_dir / "updates.csv")
    assert 2 <= ckpt["iteration"] < 12 and ckpt["global_step"] == int(rows[-1]["global_step"])

    out = run(name, "--resume", run_dir / "checkpoint.pt", "--seed", "2")
    assert out.returncode == 2 and "--seed" in out.stderr.strip().splitlines()[-1]
    out = run(name, "--resume", run_dir / "checkpoint.pt", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    rows = read_csv(run_dir / "updates.csv")
    assert [int(r["global_step"]) for r in rows] == list(range(256, 3073, 256))  # none lost or twice
    lr = float(rows[0]["learning_rate"])  # the schedule carried on where it stopped
    expected = [lr * (1 - i / 12) for i in range(12)]
    assert [float(r["learning_rate"]) for r in rows] == pytest.approx(expected, rel=1e-5)
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["global_step"] == 3072


@pytest.mark.slow
@pytest.mark.parametrize("name", PPO)
def test_a_nonfinite_loss_stops_with_exit_1_and_keeps_the_last_good_checkpoint(name, tmp_path):
    out = run(name, *SMALL[name], "--total-timesteps", "256", "--run-dir", tmp_path)
    assert out.returncode == 0, out.stderr
    good = (tmp_path / "checkpoint.pt").read_bytes()
    # A huge learning rate sends the weights to infinity at the first optimizer step.
    out = run(name, *SMALL[name], "--total-timesteps", "1024", "--learning-rate", "1e30",
              "--run-dir", tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "non-finite loss in update" in out.stderr.strip().splitlines()[-1]
    assert (tmp_path / "checkpoint.pt").read_bytes() == good
    assert (tmp_path / "curve.png").exists() and (tmp_path / "updates.csv").exists()
