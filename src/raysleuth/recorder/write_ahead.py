"""The write-ahead file: urgent rows on disk before ``record`` returns.

A worker that Ray ends without a chance to run Python (its actor killed
with force when the job ends) keeps its WARNING-and-above records: each is
one ``write`` to ``<spool file>.wal.jsonl`` (0600), emptied once the
records are delivered or spooled.

Signals: a SIGTERM handler runs in the main thread, possibly while that
thread is inside :meth:`WriteAhead.write` holding the lock. The exit path
(:meth:`clear`, :meth:`hand_over`) therefore never waits for a lock this
thread holds, and waits at most a second for another thread's.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any, Callable

from raysleuth.recorder.files import private_file
from raysleuth.recorder.store import redacted_row

__all__ = ["WriteAhead"]


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
                buffer.append(row)
                if self._bytes >= self.max_bytes:
                    return  # full: the row is still queued (and spooled, under the spool's own cap)
                if self._fd is None:
                    self._fd = private_file(self.path)
                text = json.dumps(list(redacted_row(row)), default=repr, separators=(",", ":")) + "\n"
                if not self._headed:
                    text = json.dumps({"header": header()}, default=repr, separators=(",", ":")) + "\n" + text
                    self._headed = True
                data = text.encode("utf-8")
                os.write(self._fd, data)
                self._bytes += len(data)
            except Exception:
                self.enabled = False  # read-only home, disk full: the normal path still delivers
            finally:
                self._owner = None

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
