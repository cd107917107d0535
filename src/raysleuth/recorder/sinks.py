"""Where a client's batches go: the run's writer actor, or a local store.

``deliver(header, rows)`` raises when the batch was not stored; the client
then spools it (:mod:`raysleuth.recorder.spool`).
"""

from __future__ import annotations

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

    A delivery waits in short ``ray.get`` slices, so :meth:`cancel` (called
    before ``ray.shutdown()``) stops it within a slice: no thread of ours is
    left inside a Ray call when Ray's core worker goes away (that ends the
    whole process). A worker that leaves on its own still ends inside such a
    call at times; the client's flight file holds the batch. (Waiting on the
    reply's ``future()`` instead, which calls no Ray, lost a rank's batch in
    1 job in 20 to 40 of ``bench_exit``: counted delivered, never stored.)
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
        import ray

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
            ref = handle.write.remote(header, rows)
            deadline = time.monotonic() + self.timeout
            while True:
                if self._cancelled.is_set():
                    raise ConnectionError("Ray is shutting down in this process: kept in the spool")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the evidence writer did not answer within {self.timeout:.0f}s")
                try:
                    ray.get(ref, timeout=min(0.1, remaining))
                    return
                except ray.exceptions.GetTimeoutError:
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
