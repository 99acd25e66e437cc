"""SPEC.md's limits on every script: size, line length, and only the standard library and requirements.txt."""
import ast
import os
import io
import sys
import tokenize

import pytest

from conftest import ROOT, SCRIPTS


def code_lines(source):
    """Lines that are neither blank nor comment nor docstring."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docstrings |= set(range(body[0].lineno, body[0].end_lineno + 1))
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            code |= set(range(tok.start[0], tok.end[0] + 1)) - docstrings
    return len(code)


@pytest.mark.parametrize("name", SCRIPTS)
def test_size_and_line_length(name):
    source = (ROOT / f"{name}.py").read_text()
    lines = source.splitlines()
    assert len(lines) <= 500
    assert code_lines(source) <= 400
    assert code_lines("x = 1\n# c\n\ndef f():\n    '''doc\n    more'''\n    return 2\n") == 3  # the counter
    too_long = [i + 1 for i, line in enumerate(lines) if len(line) > 110]
    assert not too_long, f"lines over 110 characters: {too_long}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_imports_only_stdlib_and_requirements(name):
    allowed = set(sys.stdlib_module_names) | {"numpy", "torch", "gymnasium", "ale_py", "mujoco", "matplotlib",
                                              "PIL", "tqdm"}
    tree = ast.parse((ROOT / f"{name}.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= allowed, imported - allowed
    assert not imported & {s.removesuffix(".py") for s in SCRIPTS}, "a script imports a sibling"


@pytest.mark.parametrize("name", SCRIPTS)
def test_import_parses_nothing_builds_nothing_writes_nothing(name, tmp_path, monkeypatch):
    from conftest import load_script
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--no-such-flag"])  # parsed, this would exit 2
    module = load_script(name)
    assert os.listdir(tmp_path) == [] and callable(module.compute_gae) and callable(module.ppo_loss)
