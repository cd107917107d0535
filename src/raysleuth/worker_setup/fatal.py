"""The fatal-signal file: where a worker's Python stacks go when it dies of SIGSEGV, SIGABRT, SIGBUS, SIGFPE.

``faulthandler`` writes the stacks of every thread into
``<ray session dir>/logs/raysleuth-fatal-<pid>.log``. The first line says
who the process is::

    # raysleuth fatal-signal file pid=<pid> rank=<rank or -> actor_id=<id or -> job_id=<id or ->

and ``# rank=<n>`` is appended once the rank becomes known (after
``init_process_group``). Being in Ray's session logs folder, the file is
readable through Ray's log API after the process is gone. A clean exit
removes it, so a file left behind means the process died: with a stack
under the header, of a fatal signal; with the header alone, killed without
a chance to write (SIGKILL, the OOM killer) or ended by ``os._exit``.

Ray itself points ``faulthandler`` at the worker's ``.err`` log (main thread
only); this moves it to the file above with *all* threads, since Ray Train
runs the user's code off the main thread.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import sys
from pathlib import Path
from typing import IO

__all__ = ["FILE_PREFIX", "fatal_file_path", "header_line", "install", "note_rank", "parse_header"]

FILE_PREFIX = "raysleuth-fatal-"
_HEADER = "# raysleuth fatal-signal file"

_file: IO[str] | None = None
_path: Path | None = None
_pid: int | None = None


def fatal_file_path(logs_dir: Path | str, pid: int) -> Path:
    """Where the fatal-signal file of ``pid`` lives in a session's logs folder."""
    return Path(logs_dir) / f"{FILE_PREFIX}{pid}.log"


def _field(value: object) -> str:
    text = "-" if value is None or value == "" else str(value)
    return "".join(ch if not ch.isspace() else "_" for ch in text)


def header_line(pid: int, rank: int | None = None, actor_id: str | None = None, job_id: str | None = None) -> str:
    """The first line of a fatal-signal file (no newline)."""
    return f"{_HEADER} pid={pid} rank={_field(rank)} actor_id={_field(actor_id)} job_id={_field(job_id)}"


def parse_header(text: str) -> dict[str, str | None]:
    """The fields of a fatal-signal file's header and later ``# rank=`` lines (pure; '-' becomes None)."""
    fields: dict[str, str | None] = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            continue
        body = line[len(_HEADER):] if line.startswith(_HEADER) else line[1:]
        for part in body.split():
            key, sep, value = part.partition("=")
            if sep:
                fields[key] = None if value == "-" else value
    return fields


def install(logs_dir: Path | str, *, rank: int | None = None, actor_id: str | None = None,
            job_id: str | None = None) -> Path:
    """Send this process's fatal-signal stacks (all threads) to its file in ``logs_dir``; returns the path."""
    global _file, _path, _pid
    pid = os.getpid()
    path = fatal_file_path(logs_dir, pid)
    handle = open(path, "w", encoding="utf-8")
    handle.write(header_line(pid, rank, actor_id, job_id) + "\n")
    handle.flush()
    faulthandler.enable(file=handle, all_threads=True)
    previous = _file
    _file, _path, _pid = handle, path, pid
    if previous is not None:
        try:
            previous.close()
        except Exception:
            pass
    if not getattr(install, "_registered", False):
        atexit.register(_remove_on_clean_exit)
        os.register_at_fork(after_in_child=_after_fork_in_child)
        install._registered = True  # type: ignore[attr-defined]
    return path


def note_rank(rank: int) -> None:
    """Append ``# rank=<n>`` to this process's file (the rank became known after start-up)."""
    if _file is None or _pid != os.getpid():
        return
    try:
        _file.write(f"# rank={int(rank)}\n")
        _file.flush()
    except Exception:
        pass


def _remove_on_clean_exit() -> None:
    if _path is None or _pid != os.getpid():
        return
    try:
        faulthandler.disable()
        _path.unlink(missing_ok=True)
    except Exception:
        pass


def _after_fork_in_child() -> None:
    """A forked child (a data loader...) is not the worker: back to Ray's default, stderr."""
    global _file, _path, _pid
    _file, _path, _pid = None, None, None
    try:
        faulthandler.enable(file=sys.stderr, all_threads=False)
    except Exception:
        pass
