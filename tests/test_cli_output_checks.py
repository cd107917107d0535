"""Bad paths and ranks get one clear line, not a quiet fallback (issue 29, point 10). No Ray here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from raysleuth.postmortem import build_capsule
from raysleuth.recorder.store import open_run

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


@dataclasses.dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(home, capsys):
    """Run the command line in this process (fast: no interpreter start per call) on the test home."""
    from raysleuth.cli import main

    def run(*args: str) -> Done:
        capsys.readouterr()
        code = main([*args, "--home", str(home)])
        out = capsys.readouterr()
        return Done(code, out.out, out.err)

    return run


def _line(done: Done) -> str:
    return " ".join(done.stderr.split())


def test_report_paths(cli, tmp_path):
    missing = tmp_path / "nonexistent" / "dir" / "r.html"
    done = cli("report", "-o", str(missing))
    assert done.returncode == 2 and "does not exist" in _line(done) and not missing.parent.exists(), done.stderr
    done = cli("report", "-o", str(tmp_path))
    assert done.returncode == 0 and (tmp_path / "report.html").is_file(), done.stderr
    done = cli("report", "-o", str(tmp_path / "r.html"), "--trace", str(tmp_path / "missing.json"))
    assert done.returncode == 2 and "no such file" in _line(done), done.stderr


def test_runs_given_by_name_and_by_path(cli):
    done = cli("crashes", "--run", "/etc/passwd")
    assert done.returncode == 2 and "not a raysleuth evidence store" in _line(done), done.stderr
    assert "move the file aside" not in done.stderr
    done = cli("crashes", "--run", "latest", "--json")
    assert done.returncode == 1 and "session_checks" in done.stderr, done.stderr


def test_a_rank_the_run_does_not_have(cli):
    done = cli("logs", "--rank", "99")
    assert done.returncode == 2 and "no rank 99 in this run; ranks recorded: 0-1:" in _line(done), done.stderr
    assert cli("logs", "--rank", "1").returncode == 0


def test_memory_rows_of_rays_own_processes_are_named():
    from raysleuth.cli.memory import _who
    from raysleuth.memory.workers import WorkerMemory

    assert _who(WorkerMemory(rank=None, pid=1, node_ip=None, actor_class="DashboardAgent", source="agent")) == \
        "DashboardAgent (Ray's own)"
    assert _who(WorkerMemory(rank=None, pid=2, node_ip=None, actor_class="RuntimeEnvAgent")) == \
        "RuntimeEnvAgent (Ray's own)"
    assert _who(WorkerMemory(rank=3, pid=3, node_ip=None, actor_class="Trainer")) == "Trainer"
