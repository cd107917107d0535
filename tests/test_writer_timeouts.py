"""A writer that does not answer (its process stopped) makes `memory` and `debug arm` say so in one line.

The evidence writer of the session cluster is really stopped (SIGSTOP) for
the duration of each command, then continued; nothing is mocked.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import time

import pytest

from raysleuth.cli import main


def _writer_pid() -> int:
    import ray

    from raysleuth.recorder import get_writer

    return int(ray.get(get_writer().info.remote(), timeout=120)["pid"])  # it exists and answers before we stop it


@contextlib.contextmanager
def stopped(pid: int):
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _run(*argv: str) -> tuple[int, str, float]:
    err = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, err.getvalue(), time.monotonic() - started


@pytest.mark.parametrize("argv", [("debug", "arm"), ("memory", "--sample", "1s")], ids=" ".join)
def test_stuck_writer_is_one_line_not_a_traceback(ray_cluster, monkeypatch, argv):
    monkeypatch.setenv("RAYSLEUTH_WRITER_TIMEOUT", "3")
    pid = _writer_pid()
    with stopped(pid):
        code, err, seconds = _run(*argv, "--address", ray_cluster.address)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "writer did not" in lines[0] and "Traceback" not in err, err
    assert seconds < 60
    if argv[0] == "debug":
        assert main(["debug", "disarm", "--address", ray_cluster.address]) == 0  # the writer answers again
