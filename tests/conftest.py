"""Shared by every test: the list of scripts the harness checks, and how to load one by path."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Each script joins the shared harness (test_math.py) by adding its module name here.
SCRIPTS = ["ppo_atari", "ppo_continuous", "ppo_lstm", "ppo_evolve"]


def load_script(name):
    """Import ROOT/<name>.py as a module: importing one must parse, build and write nothing."""
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=SCRIPTS, scope="module")
def script(request):
    return load_script(request.param)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds (end-to-end runs, learning checks)")
