"""Bad paths and ranks get one clear line, not a quiet fallback (issue 29, point 10). No Ray here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raysleuth.postmortem import build_capsule
from raysleuth.recorder.store import open_run

ENV = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("home")
    store = open_run(home, "session_checks")
    for rank in (0, 1):
        try:
            raise RuntimeError(f"rank {rank} failed")
        except RuntimeError as error:
            store.add("crash", build_capsule(error, method="Trainer.step").to_dict(), rank=rank, name="Trainer.step",
                      level="ERROR")
    store.close()
    (home / "runs" / "latest").write_text("session_checks\n")
    return home


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raysleuth", *args], capture_output=True, text=True,
                          env={**ENV, "RAYSLEUTH_HOME": str(home)}, timeout=120)


def _line(done: subprocess.CompletedProcess) -> str:
    return " ".join(done.stderr.split())


def test_report_paths(home, tmp_path):
    missing = tmp_path / "nonexistent" / "dir" / "r.html"
    done = _cli(home, "report", "-o", str(missing))
    assert done.returncode == 2 and "does not exist" in _line(done) and not missing.parent.exists(), done.stderr
    done = _cli(home, "report", "-o", str(tmp_path))
    assert done.returncode == 0 and (tmp_path / "report.html").is_file(), done.stderr
    done = _cli(home, "report", "-o", str(tmp_path / "r.html"), "--trace", str(tmp_path / "missing.json"))
    assert done.returncode == 2 and "no such file" in _line(done), done.stderr


def test_runs_given_by_name_and_by_path(home):
    done = _cli(home, "crashes", "--run", "/etc/passwd")
    assert done.returncode == 2 and "not a raysleuth evidence store" in _line(done), done.stderr
    assert "move the file aside" not in done.stderr
    done = _cli(home, "crashes", "--run", "latest", "--json")
    assert done.returncode == 1 and "session_checks" in done.stderr, done.stderr


def test_a_rank_the_run_does_not_have(home):
    done = _cli(home, "logs", "--rank", "99")
    assert done.returncode == 2 and "no rank 99 in this run; ranks recorded: 0, 1" in _line(done), done.stderr
    assert _cli(home, "logs", "--rank", "1").returncode == 0


def test_memory_rows_of_rays_own_processes_are_named():
    from raysleuth.cli.memory import _who
    from raysleuth.memory.workers import WorkerMemory

    assert _who(WorkerMemory(rank=None, pid=1, node_ip=None, actor_class="DashboardAgent", source="agent")) == \
        "DashboardAgent (Ray's own)"
    assert _who(WorkerMemory(rank=None, pid=2, node_ip=None, actor_class="RuntimeEnvAgent")) == \
        "RuntimeEnvAgent (Ray's own)"
    assert _who(WorkerMemory(rank=3, pid=3, node_ip=None, actor_class="Trainer")) == "Trainer"
