"""The spool: evidence a client could not deliver, kept on local disk until it can be.

Layout: ``$RAYSLEUTH_HOME/spool/<run-id>/<hostname>-<pid>-<client-id>.jsonl``.
A file is JSON lines, appended only: a dict line ``{"header": {...}}`` gives
the identity (the batch header) of the row lines that follow it; a list line
is one row packed as ``store.ROW_COLUMNS``. Never pickle.

Who delivers a spool file:

- its own client, the next time the writer answers (``RecordClient``);
- the run's writer when it starts (or restarts), for files whose process is
  gone (:func:`ingest_spools`);
- a reader (the CLI) before it opens a run, for the same files, so evidence
  of a job that ended before its records reached the writer is read from
  the same run, not lost.

Rows carry ``(client_id, seq)``; the store ignores a row it already holds, so
a file delivered twice (by its client and by the writer) is stored once.

Scaling note: a spool is read where it was written. On a multi-node cluster
the writer ingests the head node's spool; another node's spool is delivered
by its own client, or read by a CLI on that node. The next step is to have
each node's agent forward its node's abandoned spool files to the writer.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["abandoned", "append", "ingest_spools", "read_spool", "spool_dir", "spool_path", "take_delivered"]

#: A file from another host is taken as abandoned once it is this old (seconds).
FOREIGN_AGE_S = 60.0

_lock = threading.Lock()  # appends and truncations of one process's files never interleave


def spool_dir(home: Path, run_id: str) -> Path:
    """The spool folder of one run."""
    return Path(home) / "spool" / (run_id or "local")


def spool_path(home: Path, run_id: str, client_id: str) -> Path:
    """The spool file of one client of this process."""
    return spool_dir(home, run_id) / f"{socket.gethostname()}-{os.getpid()}-{client_id}.jsonl"


def append(path: Path, header: dict[str, Any], rows: list) -> int:
    """Append ``rows`` (after their header line) to ``path``; returns how many were written."""
    if not rows:
        return 0
    text = [json.dumps({"header": header}, default=repr, separators=(",", ":")) + "\n"]
    text += [json.dumps(list(row), default=repr, separators=(",", ":")) + "\n" for row in rows]
    with _lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write("".join(text))
    return len(rows)


def read_spool(path: Path, size: int | None = None) -> list[tuple[dict[str, Any], list]]:
    """The ``(header, rows)`` groups of a spool file (its first ``size`` bytes)."""
    with open(path, "rb") as handle:
        data = handle.read() if size is None else handle.read(size)
    groups: list[tuple[dict[str, Any], list]] = []
    header: dict[str, Any] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a torn last line from a killed process: skip it
        if isinstance(item, dict):
            header = item.get("header") or {}
            groups.append((header, []))
        elif isinstance(item, list) and len(item) >= 9:
            if not groups:
                groups.append((header, []))
            groups[-1][1].append(item)
    return [group for group in groups if group[1]]


def take_delivered(path: Path, size: int) -> None:
    """Remove the first ``size`` bytes (delivered) of ``path``; the file goes when nothing is left."""
    with _lock:
        try:
            with open(path, "rb") as handle:
                handle.seek(size)
                rest = handle.read()
        except OSError:
            return
        if not rest:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(rest)
        os.replace(tmp, path)


def _owner_gone(path: Path) -> bool:
    # hostnames may hold dashes: the pid is the second-to-last field
    parts = path.name[: -len(".jsonl")].rsplit("-", 2)
    if len(parts) != 3:
        return True
    host, pid_text, _client = parts
    if host != socket.gethostname():
        try:
            return time.time() - path.stat().st_mtime > FOREIGN_AGE_S
        except OSError:
            return False
    try:
        pid = int(pid_text)
    except ValueError:
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def abandoned(home: Path, run_id: str) -> list[Path]:
    """The run's spool files whose process is gone (or that their client handed over)."""
    folder = spool_dir(home, run_id)
    if not folder.is_dir():
        return []
    return [path for path in sorted(folder.glob("*.jsonl")) if _owner_gone(path)]


def ingest_spools(home: Path, store, run_id: str, *, only_abandoned: bool = True) -> int:
    """Deliver the run's spool files into ``store`` (an open, writable EvidenceStore).

    ``only_abandoned``: leave the files of live processes to their own client.
    Returns the rows newly stored. Never raises for one bad file.
    """
    folder = spool_dir(home, run_id)
    if not folder.is_dir():
        return 0
    stored = 0
    for path in abandoned(home, run_id) if only_abandoned else sorted(folder.glob("*.jsonl")):
        try:
            size = path.stat().st_size
            for header, rows in read_spool(path, size):
                stored += store.write_batch(header, rows)
            take_delivered(path, size)
        except Exception:
            continue
    return stored


def pending_runs(home: Path) -> list[str]:
    """Run ids that have spool files waiting."""
    root = Path(home) / "spool"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.jsonl")))
