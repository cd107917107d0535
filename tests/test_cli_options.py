"""One set of rank / step / duration spellings: the parsers (``raysleuth.options``) and every command's options.

The commands run for real (``raysleuth.cli.main``, and ``python -m raysleuth``
for the one-line check) on a stored run written with the evidence store,
without Ray: ``--home``/``--run`` name the run, and the address points at a
closed port so nothing reaches a cluster.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raysleuth.cli import COMMAND_MODULES, app, main, modules_to_load
from raysleuth.errors import UsageError
from raysleuth.options import StepRange, merge_ranks, parse_duration, parse_ranks, parse_since, parse_steps
from raysleuth.recorder.store import EvidenceStore, run_dir

RUN = "options-run"
RANKS, STEPS = range(4), range(1, 6)
SRC = str(Path(__file__).resolve().parent.parent / "src")

# ------------------------------------------------------------------ the parsers


@pytest.mark.parametrize(("text", "expected"), [
    ("0,2-4", [0, 2, 3, 4]), ("3", [3]), (" 5 , 1,1 ", [1, 5]), ("4-4", [4]), ("0-2,1-3", [0, 1, 2, 3]),
    (None, None), ("", None), (" ", None),
])
def test_parse_ranks(text, expected):
    assert parse_ranks(text) == expected


def test_merge_ranks_joins_repeated_options():
    assert merge_ranks([[3], [0, 1], [1, 7]]) == [0, 1, 3, 7]
    assert merge_ranks(None) is None and merge_ranks([[]]) is None


@pytest.mark.parametrize(("text", "expected"), [
    ("10-20", (10, 20)), ("10", (10, 10)), ("10-", (10, None)), ("-20", (None, 20)), (" 3 - 4 ", (3, 4)),
    (None, None), ("", None), ((2, 5), (2, 5)),
])
def test_parse_steps(text, expected):
    assert parse_steps(text) == expected
    if expected is not None:
        assert isinstance(parse_steps(text), StepRange)


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30.0), ("5m", 300.0), ("2h", 7200.0), ("1d", 86400.0), ("1.5", 1.5), ("500ms", 0.5), ("2 MIN", 120.0),
    ("10sec", 10.0), (".5", 0.5), ("0", 0.0), (4.0, 4.0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


def test_parse_since_is_a_duration_ago_or_a_time():
    assert parse_since("10m", now=1000.0) == 400.0
    assert parse_since("90", now=1000.0) == 910.0
    assert parse_since(None) is None and parse_since("") is None
    assert parse_since("2025-01-31T14:05:00+00:00") == datetime.datetime(2025, 1, 31, 14, 5, tzinfo=datetime.timezone.utc).timestamp()
    assert abs(parse_since("1h") - (time.time() - 3600)) < 5


@pytest.mark.parametrize(("parse", "text"), [
    (parse_ranks, "5-2"), (parse_ranks, "x"), (parse_ranks, "-1"), (parse_ranks, "1-"), (parse_ranks, "0-3-5"),
    (parse_ranks, "a,b"), (parse_ranks, "²"), (parse_ranks, "9" * 5000), (parse_ranks, "0-99999999"),
    (parse_steps, "a-b"), (parse_steps, "-"), (parse_steps, "20-10"), (parse_steps, "1,2"), (parse_steps, "9" * 30),
    (parse_duration, "-5s"), (parse_duration, "5x"), (parse_duration, "nan"), (parse_duration, "inf"),
    (parse_duration, "9" * 400), (parse_duration, ""), (parse_since, "yesterday"), (parse_since, "2025-13-01"),
])
def test_bad_values_are_usage_errors_with_a_fix(parse, text):
    with pytest.raises(UsageError) as raised:
        parse(text)
    assert raised.value.fix and len(str(raised.value)) < 300


# ------------------------------------------------------------------ every command, both spellings

RANK_COMMANDS = ["logs", "timeline", "crashes", "memory", "stacks", "debug arm"]
STEP_COMMANDS = ["logs", "timeline"]


def _options(path: str) -> set[str]:
    import typer.main

    command = typer.main.get_command(app)
    for name in path.split():
        command = command.commands[name]
    return {opt for param in command.params for opt in param.opts}


@pytest.mark.parametrize("path", RANK_COMMANDS)
def test_every_rank_filter_takes_both_spellings(path):
    assert {"--rank", "--ranks"} <= _options(path)


@pytest.mark.parametrize("path", STEP_COMMANDS)
def test_every_step_filter_takes_both_spellings(path):
    assert {"--step", "--steps"} <= _options(path)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A run of 4 ranks x 5 steps: a log line and a span per rank and step, a crash per rank."""
    home = tmp_path_factory.mktemp("options_home")
    path = run_dir(home, RUN) / "evidence.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    store = EvidenceStore(path)
    start = time.time() - 600
    for rank in RANKS:
        for step in STEPS:
            at = start + step
            store.add("log", {"message": f"step {step} loss={0.5 + rank}"}, time=at, rank=rank, step=step,
                      name="train", level="INFO", pid=1000 + rank)
            store.add("span", {"start": at, "end": at + 0.1 * (rank + 1), "duration_s": 0.1 * (rank + 1)},
                      time=at, rank=rank, step=step, phase="fwd", name="fwd", pid=1000 + rank)
        store.add("crash", {"exception_type": "RuntimeError", "message": f"rank {rank} failed"}, time=start + 10,
                  rank=rank, name="Trainer.train", level="ERROR", pid=1000 + rank)
    store.close()
    return home


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # nothing listens: no command reaches a cluster


def cli(home: Path, *argv: str) -> tuple[int, object]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--home", str(home), "--run", RUN, "--json"])
    assert "Traceback" not in err.getvalue(), err.getvalue()
    return code, json.loads(out.getvalue()) if out.getvalue().strip() else err.getvalue()


RANK_SPELLINGS = [("--rank", "1", "--rank", "3"), ("--rank", "1,3"), ("--ranks", "1,3"), ("--rank", "1", "--ranks", "3"),
                  ("--ranks", "3", "--ranks", "1-1")]


@pytest.mark.parametrize("ranks", RANK_SPELLINGS, ids=" ".join)
@pytest.mark.parametrize("steps", [("--step", "2-3"), ("--steps", "2-3")], ids=" ".join)
def test_logs_takes_both_spellings(home, ranks, steps):
    code, lines = cli(home, "logs", *ranks, *steps)
    assert code == 0
    assert {(line["rank"], line["step"]) for line in lines} == {(r, s) for r in (1, 3) for s in (2, 3)}


@pytest.mark.parametrize("ranks", RANK_SPELLINGS, ids=" ".join)
@pytest.mark.parametrize("steps", [("--step", "4-"), ("--steps", "4-")], ids=" ".join)
def test_timeline_takes_both_spellings(home, ranks, steps):
    code, result = cli(home, "timeline", "--summary", "--no-ray-tasks", *ranks, *steps)
    assert code == 0
    assert [row["step"] for row in result["summary"]] == [4, 5]
    assert all(set(row["durations"]) == {"1", "3"} for row in result["summary"])


@pytest.mark.parametrize("ranks", [("--rank", "0", "--rank", "2"), ("--ranks", "0,2"), ("--rank", "2", "--ranks", "0")],
                         ids=" ".join)
def test_crashes_takes_both_spellings(home, ranks):
    code, items = cli(home, "crashes", *ranks)
    assert code == 1  # crashes found
    assert sorted(item["rank"] for item in items) == [0, 2]


def test_stacks_narrows_to_several_ranks_and_names_the_absent_one():
    from raysleuth.errors import WorkerNotFound
    from raysleuth.stacks.capture import _narrow
    from raysleuth.stacks.model import ProcessStack, StackReport

    targets = {"n1": [ProcessStack(pid=100 + rank, rank=rank) for rank in (0, 1)],
               "n2": [ProcessStack(pid=100 + rank, rank=rank) for rank in (2, 3)]}
    report = StackReport()
    kept = _narrow(report, targets, None, [1, 3, 9])
    assert {node: [p.rank for p in procs] for node, procs in kept.items()} == {"n1": [1], "n2": [3]}
    assert [item.reason for item in report.missing] == ["no worker has rank 9"]
    assert [p.rank for p in _narrow(StackReport(), targets, None, 2)["n2"]] == [2]  # one int, as before
    with pytest.raises(WorkerNotFound):
        _narrow(StackReport(), targets, None, [7, 8])


def test_no_rank_option_means_every_rank(home):
    code, lines = cli(home, "logs")
    assert code == 0 and {line["rank"] for line in lines} == set(RANKS)


def test_since_takes_durations_and_times(home):
    assert len(cli(home, "logs", "--since", "1d")[1]) == len(RANKS) * len(STEPS)
    assert len(cli(home, "logs", "--since", "2h", "--ranks", "0")[1]) == len(STEPS)
    assert cli(home, "logs", "--since", "30s")[1] == []  # written ten minutes ago
    future = datetime.datetime.now() + datetime.timedelta(hours=1)
    assert cli(home, "logs", "--since", future.isoformat(timespec="seconds"))[1] == []


# ------------------------------------------------------------------ bad values: one line, exit 2


@pytest.mark.parametrize(("argv", "named"), [
    (("timeline", "--summary", "--ranks", "3-1"), "--rank"),
    (("timeline", "--summary", "--steps", "9-3"), "--step"),
    (("logs", "--rank", "x"), "--rank"),
    (("logs", "--step", "a-b"), "--step"),
    (("logs", "--since", "yesterday"), "--since"),
    (("crashes", "--ranks", "0,-1"), "--rank"),
    (("memory", "--sample", "5x"), "--sample"),
    (("watch", "--stall", "2 fortnights"), "--stall"),
    (("tasks", "--older-than", "-5s"), "--older-than"),
])
def test_bad_value_is_one_red_line_and_exit_2(home, argv, named):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, *sys.path]), "RAYSLEUTH_HOME": str(home),
           "RAY_ADDRESS": "127.0.0.1:1"}
    done = subprocess.run([sys.executable, "-m", "raysleuth", *argv], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith("raysleuth: ") and named in done.stderr, done.stderr


# ------------------------------------------------------------------ the command line loads the command it runs


def test_each_command_is_loaded_from_its_own_module():
    """The command line imports only the module of the command it runs (``modules_to_load``): every command's
    module is the one that name loads, so a command added elsewhere fails here until ``MODULE_OF`` names it."""
    import typer.main

    commands = typer.main.get_command(app).commands
    assert len(commands) >= len(COMMAND_MODULES)
    for name, command in commands.items():
        callback = command.callback if command.callback is not None else next(iter(command.commands.values())).callback
        assert modules_to_load(name) == (callback.__module__.rsplit(".", 1)[1],), name
    for word in (None, "", "--help", "no-such-command"):
        assert modules_to_load(word) == COMMAND_MODULES


def test_a_command_runs_with_its_module_alone_and_help_lists_every_one():
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent / "src"))
    probe = ("import sys, runpy; sys.argv = ['raysleuth'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('raysleuth', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "import json; print(json.dumps(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
             "if m.startswith('raysleuth.cli.') and m != 'raysleuth.cli._app')))")
    one = subprocess.run([sys.executable, "-c", probe, "gc", "--help"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert one.returncode == 0 and json.loads(one.stdout.strip().splitlines()[-1]) == ["gc"], one.stdout + one.stderr
    every = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True, text=True, env=env,
                           timeout=120)
    assert "report" in every.stdout and "stacks" in every.stdout and "gc" in every.stdout
    assert json.loads(every.stdout.strip().splitlines()[-1]) == sorted(COMMAND_MODULES)
