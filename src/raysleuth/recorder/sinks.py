"""Where a client's batches go: through the node's agent to the run's writer actor, or a local store.

Inside Ray a client hands its batches to its own node's agent
(:class:`RelaySink`), which sends the node's batches to the writer in one
call (:mod:`raysleuth.agents.relay`); ``RAYSLEUTH_RELAY=0`` sends each
straight to the writer (:class:`WriterSink`).

``deliver(header, rows)`` raises when the batch was not stored; the client
then spools it (:mod:`raysleuth.recorder.spool`).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Protocol

__all__ = ["RelaySink", "Sink", "StoreSink", "WriterSink", "ray_sink"]

#: How often a client without a relaying node agent looks for one again (seconds).
RELAY_LOOKUP_S = 10.0


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
            ref = self._submit(header, rows, get_writer)
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
            self._lost()
            raise
        finally:
            with self._active_lock:
                self._active -= 1
                self._active_lock.notify_all()

    def _submit(self, header: dict[str, Any], rows: list, get_writer: Callable[[], Any]) -> Any:
        """Send the batch; the reference to wait on."""
        handle = self._handle
        if handle is None:
            handle = self._handle = get_writer()
        return handle.write.remote(header, rows)

    def _lost(self) -> None:
        self._handle = None  # look it up again next time: it may have been replaced

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


class RelaySink(WriterSink):
    """Deliver through this node's agent, which sends its node's batches to the writer in one call
    (:mod:`raysleuth.agents.relay`); the same wait, cancel and errors as :class:`WriterSink`.

    Where the node has no agent that relays (none yet, or one from an older raysleuth), straight to the
    writer; it looks for one again every :data:`RELAY_LOOKUP_S`. After a failed delivery it looks at once.
    """

    def __init__(self, timeout: float = 10.0) -> None:
        super().__init__(timeout)
        self._agent: Any = None
        self._look_at = 0.0

    def _submit(self, header: dict[str, Any], rows: list, get_writer: Callable[[], Any]) -> Any:
        if self._agent is None and time.monotonic() >= self._look_at:
            import ray

            # lazy: the agents package loads only where a client delivers inside Ray
            from raysleuth.agents.controls import node_agent

            self._look_at = time.monotonic() + RELAY_LOOKUP_S
            self._agent = node_agent(ray, "deliver")
        if self._agent is not None:
            return self._agent.deliver.remote(header, rows, max(1.0, self.timeout - 0.5))
        return super()._submit(header, rows, get_writer)

    def _lost(self) -> None:
        super()._lost()
        if self._agent is not None:
            self._agent, self._look_at = None, 0.0  # the agent may be gone: look again (or go straight)


def ray_sink() -> WriterSink:
    """The sink of a process inside Ray: through its node's agent, or straight to the writer when
    ``RAYSLEUTH_RELAY=0``."""
    return WriterSink() if os.environ.get("RAYSLEUTH_RELAY", "1") == "0" else RelaySink()
