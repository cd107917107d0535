"""Where a client's batches go: the run's writer actor, or a local store.

``deliver(header, rows)`` raises when the batch was not stored; the client
then spools it (:mod:`raysleuth.recorder.spool`).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Protocol

__all__ = ["Sink", "StoreSink", "WriterSink"]


class Sink(Protocol):
    """Where batches go. ``deliver`` raises when the batch was not stored."""

    def deliver(self, header: dict[str, Any], rows: list) -> None: ...


class StoreSink:
    """Deliver straight into a local :class:`EvidenceStore`."""

    def __init__(self, store) -> None:
        self.store = store

    def deliver(self, header: dict[str, Any], rows: list) -> None:
        self.store.write_batch(header, rows)


class WriterSink:
    """Deliver to the run's writer actor (looked up, or created, on demand).

    A delivery waits on the reply's ``concurrent.futures.Future`` in short
    slices, a wait in Python that never calls into Ray, so :meth:`cancel`
    (called before ``ray.shutdown()``) stops it within a slice: no thread of
    ours is left inside a Ray call when Ray's core worker goes away. Polling
    Ray instead (``ray.get`` with a timeout, ten times a second) ended the
    process of an actor leaving on its own: once the core worker is gone,
    Ray's next call from any thread exits the process at once, before
    Python's exit, so the actor's unsent records never reached the spool
    (about one exit in four on a loaded machine).
    """

    #: A delivery calls into Ray: the client puts the batch in its flight file first.
    CALLS_RAY = True

    def __init__(self, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self._handle = None
        self._cancelled = threading.Event()
        self._active = 0
        self._active_lock = threading.Condition()

    def deliver(self, header: dict[str, Any], rows: list) -> None:
        # lazy: importing the writer at the head deadlocks two threads' imports (recorder/__init__)
        from raysleuth.recorder.writer import get_writer

        with self._active_lock:
            if self._cancelled.is_set():
                raise ConnectionError("Ray is shutting down in this process: kept in the spool")
            self._active += 1
        try:
            handle = self._handle
            if handle is None:
                handle = self._handle = get_writer()
            reply = handle.write.remote(header, rows).future()
            deadline = time.monotonic() + self.timeout
            while True:
                if self._cancelled.is_set():
                    raise ConnectionError("Ray is shutting down in this process: kept in the spool")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the evidence writer did not answer within {self.timeout:.0f}s")
                try:
                    reply.result(timeout=min(0.1, remaining))  # raises the writer's error, if it had one
                    return
                except concurrent.futures.TimeoutError:
                    continue
        except Exception:
            self._handle = None  # look it up again next time: it may have been replaced
            raise
        finally:
            with self._active_lock:
                self._active -= 1
                self._active_lock.notify_all()

    def cancel(self, wait: float = 1.0) -> bool:
        """Refuse new deliveries and wait (bounded) until none is inside a Ray call; True when none is."""
        self._cancelled.set()
        deadline = time.monotonic() + wait
        with self._active_lock:
            while self._active:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._active_lock.wait(remaining)
        return True
