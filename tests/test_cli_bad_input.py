"""Bad input never gives a traceback: every command, bad options, a store full of bad rows.

Runs the real CLI (``raysleuth.cli.main``) in-process, without Ray: the
cluster address points at a closed port, so commands that need a cluster
fail fast with their one line. A traceback shows up here as an exception
out of ``main`` (or a line of ``Traceback`` on stderr).

When an earlier module of the same pytest run connected this process to
the session cluster, the commands would act on that cluster (``watch``
would follow it forever, ``debug arm`` would arm it): then the module runs
itself in a fresh interpreter instead (``test_in_a_fresh_interpreter``).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from badstore import seed_bad_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raysleuth.cli import app, main

NO_CLUSTER = "127.0.0.1:1"  # nothing listens: connecting fails at once, never reaches another cluster


@pytest.fixture(scope="module")
def bad_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("bad_home")
    seed_bad_run(home)
    return home


_CHILD = "RAYSLEUTH_BAD_INPUT_CHILD"


def _connected() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def test_in_a_fresh_interpreter(tmp_path):
    """Only when this process is connected to Ray: run this module where it is not."""
    if not _connected():
        pytest.skip("not connected to Ray: the tests below run in this process")
    env = {**os.environ, _CHILD: "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:]


@pytest.fixture(autouse=True)
def _isolated(bad_home, tmp_path, monkeypatch, request):
    if request.node.name == "test_in_a_fresh_interpreter":
        return
    if _connected():
        pytest.skip("this process is connected to Ray: test_in_a_fresh_interpreter runs these in a fresh one")
    monkeypatch.setenv("RAYSLEUTH_HOME", str(bad_home))
    monkeypatch.setenv("RAY_ADDRESS", NO_CLUSTER)
    monkeypatch.setenv("RAYSLEUTH_WRITER_TIMEOUT", "3")
    monkeypatch.delenv("RAYSLEUTH_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)  # report.html, .vscode/ land here


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    stdin, sys.stdin = sys.stdin, io.StringIO("")  # `explain` with no text reads stdin
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        sys.stdin = stdin
    return code, out.getvalue(), err.getvalue()


_RUN_LINE = re.compile(r"^run \S+ \((--run|the connected cluster's run|the newest run; --run picks another)\): ")


def problem_lines(err: str) -> list[str]:
    """stderr's lines, less the one line every reading command prints to name the run it shows."""
    return [line for line in err.splitlines() if line.strip() and not _RUN_LINE.match(line)]


def assert_clean(code: int, err: str, *, codes=(0, 1, 2)) -> None:
    assert code in codes, (code, err)
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(problem_lines(err)) <= 1, err


# ------------------------------------------------------------------ a store of bad rows

STORE_COMMANDS = [
    ("consistency",), ("consistency", "--json"), ("crashes",), ("crashes", "--json"), ("crashes", "show", "3"),
    ("memory",), ("memory", "--json"), ("memory", "--since", "1h", "--job", "02000000"),
    ("timeline", "--summary", "--no-ray-tasks"),
    ("timeline", "--summary", "--json", "--no-ray-tasks"), ("timeline", "--no-ray-tasks", "-o", "t.json"),
    ("report", "-o", "r.html"), ("report", "--json", "-o", "r.html"), ("logs",), ("logs", "--json"),
    ("logs", "--aggregate"), ("logs", "--level", "ERROR", "--step", "1-3"), ("debug", "ls", "--run", "bad-run"),
    ("explain", "crash-5"), ("weights",), ("weights", "--json"), ("stragglers", "--run", "bad-run"),
    ("stragglers", "--run", "bad-run", "--json"),
]


@pytest.mark.parametrize("argv", STORE_COMMANDS, ids=" ".join)
def test_commands_read_past_bad_rows(argv):
    code, out, err = run_cli(*argv)
    assert_clean(code, err)


def test_crashes_show_every_bad_capsule(bad_home):
    from raysleuth.recorder import open_store

    store = open_store("bad-run", home=bad_home)
    try:
        ids = [row.id for row in store.query("crash")]
    finally:
        store.close()
    assert len(ids) >= 10
    for capsule_id in ids:
        for extra in ((), ("--json",)):
            code, out, err = run_cli("crashes", "show", str(capsule_id), *extra)
            assert_clean(code, err, codes=(0,))


def test_bad_rows_do_not_hide_the_good_ones(bad_home):
    from raysleuth.recorder import open_store

    store = open_store("bad-run", home=bad_home)
    try:
        rows = store.query("custom")
    finally:
        store.close()
    assert rows and all(isinstance(row.data, dict) for row in rows)
    assert {"value": [1, 2, 3]} in [row.data for row in rows]


# ------------------------------------------------------------------ reproduced cases


def test_vscode_path_to_a_directory_writes_inside_it(tmp_path):
    (tmp_path / ".vscode").mkdir()
    code, out, err = run_cli("debug", "vscode", "--run", "bad-run", "--path", str(tmp_path / ".vscode"))
    assert_clean(code, err, codes=(0,))
    assert (tmp_path / ".vscode" / "launch.json").is_file()


def test_vscode_path_not_writable_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    code, out, err = run_cli("debug", "vscode", "--run", "bad-run", "--path", str(tmp_path / "file" / "launch.json"))
    assert_clean(code, err, codes=(2,))
    assert "cannot write" in err


@pytest.mark.parametrize("folder", ["/", "."])
def test_timeline_to_a_folder_is_one_line(folder):
    code, out, err = run_cli("timeline", "--no-ray-tasks", "-o", folder)  # hypothesis found "/" (a traceback)
    assert_clean(code, err, codes=(2,))
    assert "is a folder" in err and "trace.json" in err, err


def test_logs_ray_grep_bad_regex_is_one_line():
    code, out, err = run_cli("logs", "--ray", "--pid", "4242", "--grep", "[")
    assert_clean(code, err, codes=(2,))
    assert "regular expression" in err


@pytest.mark.parametrize("argv", [
    ("watch", "--interval", "-1"), ("watch", "--interval", "nan"), ("watch", "--stall", "0"),
    ("crashes", "--limit", "0"), ("tasks", "--limit", "-1"), ("logs", "--limit", "0"), ("consistency", "--limit", "0"),
    ("stacks", "--timeout", "inf"), ("logs", "--ray", "--tail", "0"), ("memory", "--sample", "-5s"),
    ("memory", "--sample", "1s", "--interval", "0"), ("crashes", "show", "x"), ("nosuch",), ("crashes", "--bogus"),
    ("logs", "--ranks", "1-x"), ("logs", "--rank", "0", "--ranks", "3-1"), ("timeline", "--summary", "--steps", "9-3"),
    ("timeline", "--summary", "--step", "x"), ("crashes", "--ranks", "-2"), ("memory", "--rank", "1,,a"),
    ("stacks", "--ranks", "0-"), ("debug", "arm", "--ranks", "a"), ("watch", "--stall", "5x"),
    ("tasks", "--older-than", "1 week"), ("collectives", "--wait", "-1s"), ("doctor", "--timeout", "0s"),
    ("memory", "--since", "yesterday"), ("memory", "--sample", "1s", "--since", "5m"),
    ("stragglers", "--window", "0"), ("stragglers", "--min-share", "2"), ("stragglers", "--rate", "0"),
])
def test_bad_values_are_usage_errors(argv):
    code, out, err = run_cli(*argv)
    assert_clean(code, err, codes=(2,))
    assert err.startswith("raysleuth: "), err


def test_usage_error_is_one_line_in_a_real_terminal_run():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "raysleuth", "crashes", "--limit", "0"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--limit" in done.stderr, done.stderr


# ------------------------------------------------------------------ generated bad options

_SKIP_COMMANDS = {"demo"}  # runs a whole job on a fresh cluster; covered by its own test
_SKIP_OPTIONS = {"--follow", "-f", "--help"}  # --follow waits for new records until stopped


def _commands():
    import typer.main

    root = typer.main.get_command(app)
    found = []

    def walk(command, path):
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in sorted(subcommands.items()):
                if name not in _SKIP_COMMANDS:
                    walk(sub, path + [name])
            if not getattr(command, "invoke_without_command", False):
                return
        options = []
        for param in command.params:
            names = [n for n in param.opts if n.startswith("-") and n not in _SKIP_OPTIONS]
            if names:
                options.append((names[0], bool(getattr(param, "is_flag", False))))
        found.append((path, options))

    walk(root, [])
    return found


COMMANDS = _commands()
BAD_VALUES = ["-1", "0", "nan", "inf", "-inf", "1e400", "[", "(?", "", " ", "abc", "1-", "-5-", "99999999999999999999",
              "/", "/nonexistent/dir/x", ".", "x" * 300, "☃", "--", "1s", "-3s", "0s", "10-2", "a,b", "\x00"]


@st.composite
def bad_argv(draw):
    path, options = draw(st.sampled_from(COMMANDS))
    argv = list(path)
    for name, is_flag in draw(st.lists(st.sampled_from(options), max_size=4)) if options else []:
        argv.append(name)
        if not is_flag:
            argv.append(draw(st.sampled_from(BAD_VALUES)))
    if draw(st.booleans()):
        argv.append(draw(st.sampled_from(BAD_VALUES)))  # a stray positional
    return [arg for arg in argv if "\x00" not in arg] if draw(st.booleans()) else argv


def test_every_command_is_generated():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"logs", "tasks", "crashes", "crashes show", "debug vscode", "watch", "memory", "timeline"} <= names


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(argv=bad_argv())
def test_generated_bad_options_never_trace(argv):
    try:
        code, out, err = run_cli(*argv)
    except ValueError as error:
        if "\x00" in "".join(argv):  # the OS refuses NUL in paths before raysleuth sees them
            return
        raise AssertionError(f"{argv}: {error!r}") from error
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    assert len(problem_lines(err)) <= 1, (argv, err)
