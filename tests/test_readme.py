"""README.md's first run works as written: its commands, run as they stand, print what it says they print."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

README = (ROOT / "README.md").read_text()


def first_run():
    """The commands of the code block after 'A first run', and the line the text says they end with."""
    section = README[README.index("A first run"):]
    commands = re.search(r"```\n(.*?)```", section, re.S).group(1).strip().splitlines()
    promised = re.search(r"ends with\s+`(\d+ episodes: [^`]+)`", section).group(1)
    return commands, promised


@pytest.mark.slow
def test_the_first_run_works_as_written(tmp_path):
    commands, promised = first_run()
    assert len(commands) == 2 and all(c.startswith("python ppo_") for c in commands)
    for command in commands:
        words = command.split()
        argv = [sys.executable, str(ROOT / words[1]), *words[2:]]
        out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, (command, out.stderr[-2000:])
    last = out.stdout.strip().splitlines()[-1]
    prefix, score = promised.rsplit(": ", 1)
    assert last.startswith(prefix + ": "), (last, promised)
    # As the README says, a second try of the first command is refused and leaves the run as it was.
    before = {p.name: p.read_bytes() for p in (tmp_path / "runs" / "first").iterdir()}
    words = commands[0].split()
    again = subprocess.run([sys.executable, str(ROOT / words[1]), *words[2:]], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    refusal = again.stderr.strip().splitlines()[-1]
    assert again.returncode == 2 and "--run-dir" in refusal and "--resume runs/first" in refusal
    assert {p.name: p.read_bytes() for p in (tmp_path / "runs" / "first").iterdir()} == before
    # The score itself is a learning result: the README's was measured on the CPUs it names, and another
    # CPU's floating-point sums take the run elsewhere. The bar is tests/test_lstm.py's for the same run (150,
    # below the lowest of 32 seeds measured on a 2-core AMD EPYC, 183.6; the memoryless control scores about 41).
    assert float(last.split(": ")[1].split()[0]) >= 150, last
    assert (tmp_path / "runs" / "first" / "curve.png").exists()


def test_every_file_the_docs_link_to_is_in_the_repository():
    """Images and pages linked from README.md and docs/*.md exist and are tracked by git (a GIF once
    was ignored by .gitignore: the page showed a broken image on every fresh clone)."""
    if shutil.which("git") is None:
        pytest.skip("no git to list the tracked files")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve().relative_to(ROOT).as_posix()
            assert path in tracked or any(t.startswith(path + "/") for t in tracked), (page.name, target)


def test_the_code_that_loads_a_trained_policy_runs_as_written(tmp_path):
    """The README's block for one's own code loads a run of ppo_continuous.py and steps its env once."""
    section = README[README.index("## A trained policy in your own code"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    folder = re.search(r'torch.load\("([^"]+)/checkpoint.pt"', code).group(1)
    train = [sys.executable, str(ROOT / "ppo_continuous.py"), "--env-id", "Pendulum-v1",
             "--total-timesteps", "512", "--num-steps", "512", "--num-minibatches", "4", "--run-dir", folder]
    out = subprocess.run(train, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    check = "\nprint(tuple(action.shape), reward.shape)\n"  # one env, Pendulum's one action
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code + check], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "(1, 1) (1,)", out.stdout


def test_the_lstm_code_that_carries_its_states_runs_as_written(tmp_path):
    """The README's block for ppo_lstm.py loads the first run's folder and plays 500 steps, its states carried:
    after them the actor's state is the LSTM's, not the zeros it started from."""
    section = README[README.index("## A trained policy in your own code"):]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[1]
    folder = re.search(r'torch.load\("([^"]+)/checkpoint.pt"', code).group(1)
    assert "import ppo_lstm as P" in code and folder == "runs/first"  # the first run's folder
    train = [sys.executable, str(ROOT / "ppo_lstm.py"), "--total-timesteps", "512", "--num-envs", "4",
             "--num-steps", "128", "--run-dir", folder]
    out = subprocess.run(train, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    check = "\nprint(step, tuple(states[0][0].shape), bool(states[0][0].abs().sum() > 0))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code + check], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "499 (1, 1, 64) True", out.stdout
