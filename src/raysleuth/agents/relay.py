"""An agent relays its node's record batches to the writer: one writer call per node at a time, not per worker.

Every worker's client (:mod:`raysleuth.recorder.client`) delivers a batch
every ``interval`` (0.2 s) while it has records. Straight to the writer, that
is about two writer RPCs a second per rank (``bench/bench_ingest.py``), so
thousands a second at 1,000 ranks, each with its own SQLite commit. A client
hands its batch to its own node's agent instead (a call on the same node);
the agent sends what its node's clients handed it in one writer call
(``write_many``: one RPC, one commit) at most once per :data:`RELAY_WINDOW_S`.
A delivery after a quiet spell goes at once: ``flush()`` in a quiet process
is not slowed.

Nothing is acknowledged before the writer stored it: each client's call
returns only once the writer answered for its batch, and raises when the
writer did not (the client then spools the batch, as when the writer is
down). A batch the writer stored after the client gave up is stored once
(rows carry the client id and a sequence number).

The agent is a threaded actor: the deliveries wait in their own
concurrency group (:data:`RELAY_THREADS` threads), so they never take the
threads its other calls (py-spy, controls) run on.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from raysleuth.cluster.own import NAMESPACE, WRITER_NAME

__all__ = ["RELAY_GROUP", "RELAY_THREADS", "RELAY_WINDOW_S", "DeliveryRelay"]

#: The least time between two writer calls of one node's relay (seconds); batches handed over meanwhile wait.
RELAY_WINDOW_S = 0.5
#: Deliveries one agent holds at once (its concurrency group); more wait in Ray's queue for the next call.
RELAY_THREADS = 128
RELAY_GROUP = "deliver"
#: Past this many rows waiting, the relay calls the writer without waiting for the window.
RELAY_MAX_ROWS = 50_000
#: How long the relay waits for the writer's answer to one call (seconds).
WRITE_TIMEOUT_S = 30.0


class _Handed:
    """One client's batch, waiting for the writer's answer."""

    __slots__ = ("header", "rows", "done", "stored", "error")

    def __init__(self, header: dict[str, Any], rows: list) -> None:
        self.header, self.rows = header, rows
        self.done = threading.Event()
        self.stored = 0
        self.error: str | None = None


class DeliveryRelay:
    """Its node's batches, to the writer in one call per window."""

    def __init__(self, window: float = RELAY_WINDOW_S) -> None:
        self.window = window
        self._cond = threading.Condition()
        self._pending: list[_Handed] = []
        self._pending_rows = 0
        self._thread: threading.Thread | None = None
        self._writer: Any = None
        self._last_call = float("-inf")
        self.batches = self.rows = self.writer_calls = self.failures = 0

    def deliver(self, header: dict[str, Any], rows: list, timeout: float = 10.0) -> int:
        """Hand one batch over and wait until the writer stored it; rows newly stored. Raises when it did not."""
        handed = _Handed(header, rows)
        with self._cond:
            self._pending.append(handed)
            self._pending_rows += len(rows)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="raysleuth-relay", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        if not handed.done.wait(max(0.1, timeout)):
            raise TimeoutError(f"the writer did not store the batch within {timeout:g}s (through the node agent)")
        if handed.error is not None:
            raise ConnectionError(f"the node agent could not deliver the batch: {handed.error}")
        return handed.stored

    def totals(self) -> dict[str, int]:
        """Batches and rows relayed, the writer calls they took, and the calls that failed."""
        return {"batches": self.batches, "rows": self.rows, "writer_calls": self.writer_calls,
                "failures": self.failures}

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                # at most one writer call per window; a full queue (or the first call after a quiet spell) goes now
                while self._pending_rows < RELAY_MAX_ROWS and time.monotonic() < self._last_call + self.window:
                    self._cond.wait(self._last_call + self.window - time.monotonic())
                taken, self._pending, self._pending_rows = self._pending, [], 0
            self._last_call = time.monotonic()
            self._call_writer(taken)

    def _call_writer(self, taken: list[_Handed]) -> None:
        import ray

        try:
            if self._writer is None:
                self._writer = ray.get_actor(WRITER_NAME, namespace=NAMESPACE)
            write_many = getattr(self._writer, "write_many", None)  # None: a writer from an older raysleuth
            refs = [write_many.remote([(item.header, item.rows) for item in taken])] if write_many is not None \
                else [self._writer.write.remote(item.header, item.rows) for item in taken]
            answers = ray.get(refs, timeout=WRITE_TIMEOUT_S)
            stored = answers[0] if write_many is not None else answers
            for item, count in zip(taken, stored):
                if count is None:  # the writer could not store this one batch; the others are stored
                    item.error = "the writer could not store this batch"
                else:
                    item.stored = int(count)
            self.writer_calls += 1
            self.batches += len(taken)
            self.rows += sum(len(item.rows) for item in taken)
        except Exception as error:  # the writer is down or replaced: every client spools its batch
            self._writer = None
            self.failures += 1
            for item in taken:
                item.error = f"{type(error).__name__}: {str(error)[:200]}"
        finally:
            for item in taken:
                item.done.set()
