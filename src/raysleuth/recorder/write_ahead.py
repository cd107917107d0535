"""Write-ahead files: rows on disk before the moment that could lose them.

Two per client: urgent rows before ``record`` returns (:meth:`WriteAhead.write`),
and the batch in flight before a delivery calls into Ray
(:meth:`WriteAhead.write_batch`, the *flight file*, emptied when the writer
answers).

A worker that Ray ends without a chance to run Python (its actor killed
with force when the job ends) keeps its WARNING-and-above records: each is
one ``write`` to ``<spool file>.wal.jsonl`` (0600), emptied once the
records are delivered or spooled.

The flight file (``<spool file>.flight.jsonl``) is for the exit Ray does
run: a worker leaving on its own (``exit_actor``, its handle out of scope)
destroys its core worker before Python's exit, and a call into Ray from any
thread in that moment ends the process at once (Ray's ``QuickExit``). A
delivery that starts then would lose its batch; the batch is on disk first.

Signals: a SIGTERM handler runs in the main thread, possibly while that
thread is inside :meth:`WriteAhead.write` holding the lock. The exit path
(:meth:`clear`, :meth:`hand_over`) therefore never waits for a lock this
thread holds, and waits at most a second for another thread's.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable

from raysleuth.recorder.files import private_file
from raysleuth.recorder.spool import _line
from raysleuth.recorder.store import redacted_row

__all__ = ["ClientFiles", "WriteAhead"]


class WriteAhead:
    """One client's write-ahead file, bounded by ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.enabled = True
        self._fd: int | None = None
        self._headed = False
        self._bytes = 0
        self._lock = threading.Lock()
        self._owner: int | None = None  # the thread inside write()

    def write(self, row: tuple, buffer: deque, header: Callable[[], dict[str, Any]]) -> None:
        """Queue ``row`` in ``buffer`` and append it to the file, under one lock (the file is emptied under it)."""
        with self._lock:
            self._owner = threading.get_ident()
            try:
                buffer.append(row)  # full or failing, the row is still queued (and spooled, under the spool's cap)
                self._append((row,), header, redact=True)
            finally:
                self._owner = None

    def write_batch(self, rows: list, header: dict[str, Any]) -> None:
        """Put ``rows`` (redacted already) in the file, after what it holds, in one ``write``. Never raises."""
        with self._lock:
            self._owner = threading.get_ident()
            try:
                self._append(rows, lambda: header)
            finally:
                self._owner = None

    def _append(self, rows: Iterable[tuple], header: Callable[[], dict[str, Any]], redact: bool = False) -> None:
        """One ``write`` of ``rows`` as spool lines, after a header line if the file has none. The caller holds
        the lock. Never raises: a read-only home or a full disk disables the file (the normal path still delivers)."""
        try:
            if self._bytes >= self.max_bytes or not self.enabled:
                return
            if self._fd is None:
                self._fd = private_file(self.path)
            text = "".join(_line(list(redacted_row(row) if redact else row)) for row in rows)
            if not self._headed:
                text = _line({"header": header()}) + text
            data = text.encode("utf-8")
            os.write(self._fd, data)
            self._headed = True
            self._bytes += len(data)
        except Exception:
            self.enabled = False

    def _hold(self) -> bool:
        """Take the lock, unless this thread holds it already (a signal handler that interrupted
        :meth:`write`: waiting would never end) or it stays busy for a second. True when taken."""
        if self._owner == threading.get_ident():
            return False
        return self._lock.acquire(timeout=1.0)

    def clear(self, buffer: deque, remove: bool = False) -> None:
        """Everything written ahead was delivered (or spooled): empty the file (``remove``: delete it)."""
        if self._fd is None or not self._hold():
            return
        try:
            if buffer and not remove:
                return  # rows written ahead may still be queued
            if remove:
                os.close(self._fd)
                self._fd, self._headed = None, False
                self.path.unlink(missing_ok=True)
            else:
                os.ftruncate(self._fd, 0)
                self._headed = False
            self._bytes = 0
        except Exception:
            pass
        finally:
            self._lock.release()

    def hand_over(self, target: Path) -> None:
        """Close the file and rename it ``target`` (for the writer or the CLI); never raises."""
        held = self._hold()  # not held: a signal handler interrupted write(); rename only
        try:
            if held and self._fd is not None:
                os.close(self._fd)
                self._fd, self._headed = None, False
            if self.path.exists():
                os.replace(self.path, target)
        except OSError:
            pass
        finally:
            if held:
                self._lock.release()


_NOTHING: deque = deque()  # no rows queued: the flight file is emptied whatever the buffer holds


class ClientFiles:
    """A client's files beside its spool: the write-ahead file (urgent rows) and the flight file (the batch in
    a delivery that calls Ray), named ``<spool file stem>.wal.jsonl`` and ``.flight.jsonl``."""

    def __init__(self, spool_path: Path, max_bytes: int) -> None:
        self.spool_path = spool_path
        stem = spool_path.name[: -len(".jsonl")]
        self.wal = WriteAhead(spool_path.with_name(stem + ".wal.jsonl"), max_bytes)
        self.flight = WriteAhead(spool_path.with_name(stem + ".flight.jsonl"), max_bytes)

    def landed(self) -> None:
        """The batch in flight reached the writer."""
        self.flight.clear(_NOTHING)

    def clear(self, buffer: deque, remove: bool = False) -> None:
        """Everything written ahead was delivered or spooled (``remove``: delete the files)."""
        self.wal.clear(buffer, remove)
        self.flight.clear(_NOTHING, remove)

    def hand_over(self, client_id: str) -> None:
        """Rename the spool and both files ``<host>-closed-<client>…`` for the writer, node agent or CLI."""
        closed = f"{os.uname().nodename}-closed-{client_id}"
        try:
            if self.spool_path.exists():
                os.replace(self.spool_path, self.spool_path.with_name(closed + ".jsonl"))
        except OSError:
            pass
        self.wal.hand_over(self.wal.path.with_name(closed + ".wal.jsonl"))
        self.flight.hand_over(self.flight.path.with_name(closed + ".flight.jsonl"))
