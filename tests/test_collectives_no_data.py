"""`collectives` never says "sequences agree" without data to compare (issue 29).

Saved dumps of a real 3-rank gloo job (tests/data/collectives/healthy.json)
are stored in a run; then the CLI reads the run with the cluster gone.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from raysleuth.recorder.store import open_run

DATA = Path(__file__).parent / "data" / "collectives"


def _store(home: Path, run: str, keep=lambda record: True) -> None:
    store = open_run(home, run)
    store.add("event", {"note": "something else was recorded"}, name="instrumented")
    for record in json.loads((DATA / "healthy.json").read_text())["records"]:
        if keep(record):
            columns = {key: record[key] for key in ("time", "rank", "name", "level", "node_id", "node_ip", "pid")}
            store.add(record["kind"], record["data"], **columns)
    store.close()


@dataclasses.dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys):
    """``raysleuth collectives --home HOME ...`` in this process (no interpreter start per call)."""
    from raysleuth.cli import main

    def run(home: Path, *args: str) -> Done:
        capsys.readouterr()
        code = main(["collectives", "--home", str(home), *args])
        out = capsys.readouterr()
        return Done(code, out.out, " ".join(out.err.split()))

    return run


def test_no_records_is_not_an_all_clear(tmp_path, cli):
    _store(tmp_path, "session_empty", keep=lambda record: False)
    done = cli(tmp_path, "--run", "session_empty")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "agree" not in done.stdout and "no collectives records" in done.stdout and "--mode full" in done.stdout


def test_healthy_run_agrees_and_an_unknown_group_is_bad_input(tmp_path, cli, monkeypatch):
    _store(tmp_path, "session_full")
    done = cli(tmp_path, "--run", "session_full", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["compared"], done.stderr
    wrong = cli(tmp_path, "--run", "session_full", "--pg", "nosuch")
    assert wrong.returncode == 2 and "no process group 'nosuch'" in wrong.stderr, wrong.stdout + wrong.stderr
    # No cluster and no --run: the newest stored run, named, instead of exit 2. Other clusters may be alive on
    # this machine, so this process is told there are none (what it asks Ray is not under test here).
    from raysleuth.cluster import connection
    from raysleuth.cluster.discovery import AddressChoice

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(connection, "choose_address", lambda address: AddressChoice(address=None, reason="none"))
    newest = cli(tmp_path, "--json")
    assert newest.returncode == 0 and "session_full" in newest.stderr, newest.stderr


def test_a_rank_that_left_no_positions_is_named(tmp_path, cli):
    _store(tmp_path, "session_partial", keep=lambda record: record["rank"] != 2)
    done = cli(tmp_path, "--run", "session_partial")
    assert done.returncode == 1 and "agree" not in done.stdout, done.stdout + done.stderr
    assert "rank(s) 2 left no positions" in done.stdout, done.stdout
