"""What every script promises about its shape: size, line length, density, imports, import side effects."""
import ast
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize

import pytest

from conftest import ROOT, SCRIPTS


def code_lines(source):
    """{line number: code on it} for the lines that are neither blank, comment nor docstring. Any string
    that stands alone as a statement counts as a docstring (module, class, function and attribute
    docstrings); a trailing comment is cut off the code, and so is the indentation."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            docstrings |= set(range(node.lineno, node.end_lineno + 1))
    lines = source.splitlines()
    code, comment_at = set(), {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comment_at[tok.start[0]] = tok.start[1]
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):
            code |= set(range(tok.start[0], tok.end[0] + 1)) - docstrings
    return {i: lines[i - 1][:comment_at.get(i)].strip() for i in sorted(code)}


def test_the_counter_itself():
    source = ("'''module\ndoc'''\nx = 1  # trailing\n# comment\n\ndef f():\n    '''doc\n    more'''\n"
              "    y = 'a'\n    'attribute doc'\n    return (y +\n            y)\n")
    assert code_lines(source) == {3: "x = 1", 6: "def f():", 9: "y = 'a'", 11: "return (y +", 12: "y)"}


# At most this many code lines and lines in all: the recurrent script and the population script carry a
# mechanism of their own each (the hidden state through rollouts and minibatches; the population).
LIMITS = {"ppo_atari": (400, 580), "ppo_continuous": (440, 620), "ppo_lstm": (500, 700),
          "ppo_evolve": (520, 740)}


@pytest.mark.parametrize("name", SCRIPTS)
def test_size_line_length_and_density(name):
    source = (ROOT / f"{name}.py").read_text()
    lines = source.splitlines()
    code = code_lines(source)
    max_code, max_all = LIMITS[name]
    assert len(lines) <= max_all, f"{len(lines)} lines; at most {max_all} in all"
    assert len(code) <= max_code, f"{len(code)} code lines; at most {max_code}"
    too_long = [i + 1 for i, line in enumerate(lines) if len(line) > 100]
    assert not too_long, f"lines over 100 characters: {too_long}"
    mean = sum(map(len, code.values())) / len(code)
    assert mean <= 42, f"{mean:.1f} characters per code line on average; at most 42"


def page_lines(source):
    """What a reader sees: the non-blank lines, indentation stripped, comments and docstrings included."""
    return [line.strip() for line in source.splitlines() if line.strip()]


def explained_lines(source):
    """The numbers of the lines that carry an explanation: a comment (above code or after it) or a
    docstring (any string that stands alone as a statement)."""
    said = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            said |= set(range(node.lineno, node.end_lineno + 1))
    return said


def test_the_page_counters_themselves():
    source = '"""doc\n\nmore"""\n\n# why\nx = {\n    "a": 1}  # tag\ny = 2\n'
    assert page_lines(source) == ['"""doc', 'more"""', "# why", "x = {", '"a": 1}  # tag', "y = 2"]
    assert explained_lines(source) == {1, 2, 3, 5, 7}  # a dict's string key is no docstring


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_page_reads_short(name):
    """The page as a reader sees it, comments counted: at most 50 characters per non-blank line on average,
    at most 8% of lines of 90 characters or more, at least a quarter of the lines explained, no function
    longer than 90 lines."""
    source = (ROOT / f"{name}.py").read_text()
    lines = source.splitlines()
    seen = page_lines(source)
    mean = sum(map(len, seen)) / len(seen)
    assert mean <= 50, f"{mean:.2f} characters per non-blank line; at most 50"
    wide = [i + 1 for i, line in enumerate(lines) if len(line) >= 90]
    assert len(wide) <= 0.08 * len(lines), f"{len(wide)} lines of 90+ characters: {wide}"
    explained = {i for i in explained_lines(source) if lines[i - 1].strip()}
    assert len(explained) >= 0.25 * len(seen), f"{len(explained)} of {len(seen)} lines explained"
    functions = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)]
    long = [(f.name, f.end_lineno - f.lineno + 1) for f in functions if f.end_lineno - f.lineno >= 90]
    assert not long, f"functions over 90 lines: {long}"


TAG = r"\b(?:core|atari|cont|lstm|aux)-\d+"


def paragraphs(source):
    """The explanations of a file: each docstring, and each run of whole-line comments on consecutive
    lines (a trailing comment stands alone)."""
    rows, found, run, last = source.splitlines(), [], [], -2
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING:
            found.append(tok.string)
        if tok.type != tokenize.COMMENT:
            continue
        whole = rows[tok.start[0] - 1].strip().startswith("#")
        if not (whole and tok.start[0] == last + 1):
            found.append(" ".join(run))
            run = []
        run.append(tok.string)
        last = tok.start[0] if whole else -2
    return found + [" ".join(run)]


def test_the_paragraph_finder_itself():
    source = '"""doc [core-1]"""\n# one [core-2]\n# two\nx = 1  # [core-3] alone\n# three\n'
    assert [p for p in paragraphs(source) if p] == ['"""doc [core-1]"""', "# one [core-2] # two",
                                                      "# [core-3] alone", "# three"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_tag_is_explained_in_a_sentence_and_the_docstring_says_what_tags_are(name):
    """A tag such as [core-7] is explained once where the code does it: it stands in a paragraph of eight
    words or more, not only in a trailing comment of a few words. The module docstring says what the tags
    are and that the README lists them."""
    source = (ROOT / f"{name}.py").read_text()
    used = set(re.findall(TAG, source))
    explained = {tag for paragraph in paragraphs(source) for tag in re.findall(TAG, paragraph)
                 if len(re.sub(r"\[[^\]]*\]|[#\"']", " ", paragraph).split()) >= 8}
    assert used and not used - explained, sorted(used - explained)
    docstring = " ".join(ast.get_docstring(ast.parse(source)).split())
    assert "37 Implementation Details of PPO" in docstring and "README" in docstring


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_history_in_the_code(name):
    """What changed and why belongs in git log and docs/, not in comments a reader has to skip."""
    source = (ROOT / f"{name}.py").read_text().lower()
    for phrase in ["kept for old", "old logs", "old commands", "used to be", "no longer"]:
        assert phrase not in source, phrase


@pytest.mark.parametrize("name", SCRIPTS)
def test_one_idea_per_line(name):
    tree = ast.parse((ROOT / f"{name}.py").read_text())
    tuple_to_tuple = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assign)
                      and isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple)]
    assert not tuple_to_tuple, f"a, b = x, y assignments at lines {tuple_to_tuple}"
    if_statements = [node.lineno for node in ast.walk(tree)
                     if isinstance(node, ast.Expr) and isinstance(node.value, ast.IfExp)]
    assert not if_statements, f"conditional expressions used as statements at {if_statements}"


def test_nothing_else_at_the_top_level():
    """The repository's top level holds the four scripts, tests/, docs/, the requirements, the README, the
    license, .gitignore and .ci/ (a process id file was once committed there by a careless `git add -A`)."""
    if shutil.which("git") is None:
        pytest.skip("no git to list the tracked files")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    allowed = {f"{name}.py" for name in SCRIPTS} | {"tests", "docs", ".ci", "requirements.txt", "README.md",
                                                     "LICENSE", ".gitignore"}
    assert {path.split("/")[0] for path in tracked} <= allowed


def test_no_reference_to_files_outside_the_repository():
    paths = [ROOT / f"{name}.py" for name in SCRIPTS] + list((ROOT / "tests").glob("*.py"))
    paths += [ROOT / "README.md"] + list((ROOT / "docs").glob("*.md"))
    outside = ["SPEC" + ".md", "FACTS" + ".md", "STYLE" + ".md"]  # spelled so, not to match this file
    found = [(path.name, word) for path in paths for word in outside if word in path.read_text()]
    assert not found


@pytest.mark.parametrize("name", SCRIPTS)
def test_imports_only_stdlib_and_requirements(name):
    allowed = set(sys.stdlib_module_names) | {"numpy", "torch", "gymnasium", "ale_py", "mujoco", "matplotlib",
                                              "PIL", "tqdm", "filelock"}
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
