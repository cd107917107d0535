"""The spool: evidence a client could not deliver, kept on local disk until it can be.

Layout: ``$RAYSLEUTH_HOME/spool/<run-id>/node-<node id>/<hostname>-<pid>-<client-id>.jsonl``
for a Ray worker or driver (its node's folder), ``spool/<run-id>/<file>`` for a
process without Ray. Folders are 0700 and files 0600 whatever the umask. A
file is JSON lines, appended only: a dict line ``{"header": {...}}`` gives
the identity (the batch header) of the row lines that follow it; a list line
is one row packed as ``store.ROW_COLUMNS``; a dict line with ``"dropped"``
says how many rows did not fit under the cap. Never pickle.

Who delivers a spool file:

- its own client, the next time the writer answers (``RecordClient``);
- the node's agent (:class:`raysleuth.agents.NodeAgent`), for files of its
  node's folder whose process is gone: it streams them to the writer, so a
  worker killed on any node keeps its write-ahead records in the run;
- the run's writer when it starts (or restarts) and every second, for the
  run's own folder and its node's folder (:func:`ingest_spools`);
- a reader (the CLI) before it opens a run, for every file on its disk, so
  evidence of a job that ended before its records reached the writer is
  read from the same run, not lost.

Rows carry ``(client_id, seq)``; the store ignores a row it already holds, so
a file delivered twice (by its client and by the writer) is stored once.

Bounds: one file holds at most :data:`MAX_BYTES` (``RAYSLEUTH_SPOOL_MAX_MB``,
default 64 MiB); rows beyond it are dropped and counted, and the count is
stored with the file as an ``event`` named ``spool_dropped`` (level WARNING).
Files are read back in batches of at most a few thousand rows
(:func:`iter_spool`), never whole.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from raysleuth.recorder.files import private_file

__all__ = ["MAX_BYTES", "abandoned", "append", "deliver_file", "ingest_spools", "iter_spool", "node_spool_dir",
           "note_drops", "read_spool", "spool_dir", "spool_path", "take_delivered"]

#: A file from another host is taken as abandoned once it is this old (seconds).
FOREIGN_AGE_S = 60.0
#: The most one spool file holds (bytes); rows beyond it are dropped and counted.
MAX_BYTES = int(float(os.environ.get("RAYSLEUTH_SPOOL_MAX_MB", "64")) * 1024 * 1024)
#: Rows per batch when a spool file is read back.
READ_BATCH = 5_000
#: A file's count of dropped rows is written at most this often (seconds), and when its client closes.
DROP_NOTE_S = 5.0

_lock = threading.Lock()  # appends and truncations of one process's files never interleave
_drops: dict[Path, list] = {}  # path -> [rows not yet noted, header, last note time]


def spool_dir(home: Path, run_id: str) -> Path:
    """The spool folder of one run."""
    return Path(home) / "spool" / (run_id or "local")


def node_spool_dir(home: Path, run_id: str, node_id: str | None) -> Path:
    """The folder of one node's files in a run (the run folder itself without a node)."""
    folder = spool_dir(home, run_id)
    return folder / f"node-{node_id[:16]}" if node_id else folder


def spool_path(home: Path, run_id: str, client_id: str, node_id: str | None = None) -> Path:
    """The spool file of one client of this process."""
    return node_spool_dir(home, run_id, node_id) / f"{socket.gethostname()}-{os.getpid()}-{client_id}.jsonl"


def _line(item: Any) -> str:
    return json.dumps(item, default=repr, separators=(",", ":")) + "\n"


def append(path: Path, header: dict[str, Any], rows: list, *, max_bytes: int | None = None) -> int:
    """Append ``rows`` (after their header line) to ``path``, up to ``max_bytes``; returns how many were written.

    Rows that do not fit are dropped and counted (see :func:`note_drops`).
    """
    if not rows:
        return 0
    limit = MAX_BYTES if max_bytes is None else max_bytes
    with _lock:
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        text = [_line({"header": header})]
        used = size + len(text[0])
        for row in rows:
            line = _line(list(row))
            used += len(line)
            if used > limit:
                break
            text.append(line)
        written = len(text) - 1
        fd = private_file(path)
        try:
            if written:
                _write_all(fd, "".join(text).encode("utf-8"))
            if written < len(rows):
                entry = _drops.setdefault(path, [0, header, 0.0])
                entry[0] += len(rows) - written
                entry[1] = header
                if time.monotonic() - entry[2] >= DROP_NOTE_S:
                    _write_drop_note(fd, path, entry, limit)
        finally:
            os.close(fd)
    return written


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_drop_note(fd: int, path: Path, entry: list, limit: int) -> None:
    if entry[0]:
        note = {"header": entry[1], "dropped": {"rows": entry[0], "cap_bytes": limit, "time": time.time()}}
        _write_all(fd, _line(note).encode("utf-8"))
    entry[0], entry[2] = 0, time.monotonic()


def note_drops(path: Path) -> None:
    """Write the count of rows dropped at ``path`` that is not on disk yet (a closing client)."""
    with _lock:
        entry = _drops.pop(path, None)
        if entry is None or not entry[0]:
            return
        fd = private_file(path)
        try:
            _write_drop_note(fd, path, entry, MAX_BYTES)
        finally:
            os.close(fd)


def _drop_row(note: dict[str, Any], path: Path) -> list:
    """The ``spool_dropped`` event a drop note becomes when its file is delivered."""
    at = float(note["time"]) if isinstance(note.get("time"), (int, float)) else time.time()
    rows = note.get("rows") if isinstance(note.get("rows"), int) else 0
    data = {"dropped_rows": rows, "cap_bytes": note.get("cap_bytes"), "spool": path.name,
            "message": f"{rows} record(s) did not fit in the spool ({note.get('cap_bytes')} bytes) "
                       "while the writer was out of reach; they are lost"}
    # seq: negative and keyed by the note's time, so a note delivered twice is stored once
    return ["event", at, None, None, None, "spool_dropped", "WARNING", data, -int(at * 1000)]


def iter_spool(path: Path, size: int | None = None,
               batch: int = READ_BATCH) -> Iterator[tuple[dict[str, Any], list]]:
    """The ``(header, rows)`` groups of a spool file (its first ``size`` bytes), at most ``batch`` rows each.

    Streams: memory is one batch, whatever the file's size.
    """
    header: dict[str, Any] = {}
    rows: list = []
    with open(path, "rb") as handle:
        left = size
        for raw in handle:
            if left is not None:
                if left <= 0:
                    break
                raw = raw[:left]
                left -= len(raw)
            try:
                item = json.loads(raw)
            except ValueError:
                continue  # a torn last line from a killed process: skip it
            if isinstance(item, dict):
                if rows:
                    yield header, rows
                    rows = []
                found = item.get("header")
                header = found if isinstance(found, dict) else header
                if isinstance(item.get("dropped"), dict):
                    yield header, [_drop_row(item["dropped"], path)]
            elif isinstance(item, list) and len(item) >= 9:
                rows.append(item)
                if len(rows) >= batch:
                    yield header, rows
                    rows = []
    if rows:
        yield header, rows


def read_spool(path: Path, size: int | None = None) -> list[tuple[dict[str, Any], list]]:
    """Every ``(header, rows)`` group of a small spool file at once (tests; deliveries stream)."""
    return list(iter_spool(path, size))


def take_delivered(path: Path, size: int) -> None:
    """Remove the first ``size`` bytes (delivered) of ``path``; the file goes when nothing is left."""
    with _lock:
        try:
            if path.stat().st_size <= size:
                path.unlink(missing_ok=True)
                return
            tmp = path.with_name(path.name + ".tmp")
            with open(path, "rb") as handle:
                handle.seek(size)
                fd = private_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(handle, out, 1 << 20)
            os.replace(tmp, path)
        except OSError:
            return


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
    return _not_its_writer(pid, path)


#: A live process whose start is this much later than the spool file's last write is not its writer (process
#: start times are read to a tick, against a boot time kept to the second).
PID_REUSE_SLACK_S = 1.0


def _not_its_writer(pid: int, path: Path) -> bool:
    """The pid answers a signal, but its process is a zombie, or was started after the file's last write: the
    writer is gone.

    A busy node wraps its pids within minutes (Ray starts workers all the time; ``pid_max`` is often 32768),
    and a file whose pid now names a stranger was never ingested."""
    try:
        import psutil

        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # ended, not yet reaped (a killed Ray worker, until its raylet waits)
            return True
        return process.create_time() > path.stat().st_mtime + PID_REUSE_SLACK_S
    except ImportError:
        return False
    except Exception as error:  # gone between the two looks, or no /proc entry: gone; unreadable: keep it
        return type(error).__name__ == "NoSuchProcess"


def _files(home: Path, run_id: str, nodes: list[str | None] | None) -> list[Path]:
    """The run's spool files: in every folder (``nodes=None``), or in the named nodes' folders (None: the run's own)."""
    folder = spool_dir(home, run_id)
    if not folder.is_dir():
        return []
    if nodes is None:
        return sorted(folder.glob("*.jsonl")) + sorted(folder.glob("node-*/*.jsonl"))
    found: list[Path] = []
    for node in nodes:
        found += sorted(node_spool_dir(home, run_id, node).glob("*.jsonl"))
    return found


def abandoned(home: Path, run_id: str, nodes: list[str | None] | None = None) -> list[Path]:
    """The run's spool files whose process is gone (or that their client handed over).

    ``nodes``: only these nodes' folders (``None`` in the list: the run's own
    folder); by default every folder on this disk.
    """
    return [path for path in _files(home, run_id, nodes) if _owner_gone(path)]


def deliver_file(path: Path, deliver, batch: int = READ_BATCH) -> int:
    """Stream one spool file to ``deliver(header, rows)`` (returns rows stored), then remove what was sent.

    Raises what ``deliver`` raises; the file then stays (rows already sent are
    stored once when it is sent again).
    """
    size = path.stat().st_size
    stored = 0
    for header, rows in iter_spool(path, size, batch):
        stored += deliver(header, rows) or 0
    take_delivered(path, size)
    return stored


def ingest_spools(home: Path, store, run_id: str, *, only_abandoned: bool = True,
                  nodes: list[str | None] | None = None) -> int:
    """Deliver the run's spool files into ``store`` (an open, writable EvidenceStore).

    ``only_abandoned``: leave the files of live processes to their own client.
    ``nodes``: as in :func:`abandoned`. Returns the rows newly stored. Never
    raises for one bad file.
    """
    stored = 0
    for path in abandoned(home, run_id, nodes) if only_abandoned else _files(home, run_id, nodes):
        try:
            stored += deliver_file(path, store.write_batch)
        except Exception:
            continue
    return stored


def pending_runs(home: Path) -> list[str]:
    """Run ids that have spool files waiting (in the run's folder or a node's)."""
    root = Path(home) / "spool"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and (any(p.glob("*.jsonl")) or any(p.glob("node-*/*.jsonl"))))
