"""An agent relays the writer's controls to its node's workers: one writer poll per node, not per worker.

Every worker's control thread (:mod:`raysleuth.control`) polls once a
second. Polling the writer directly put one RPC a second per rank on one
actor (1,000 a second at 1,000 ranks, measured by ``bench/bench_ingest.py``).
Workers poll their own node's agent instead (a call on the same node); the
agent reads the writer at most once per :data:`CONTROL_TTL_S` for all of
them, so the writer sees about one poll a second per node. A change reaches
a worker within ``CONTROL_TTL_S`` plus one poll interval.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from raysleuth.cluster.own import NAMESPACE, WRITER_NAME

__all__ = ["CONTROL_TTL_S", "READ_TIMEOUT_S", "ControlRelay"]

#: How long an agent serves the controls it last read before it reads the writer again (seconds).
CONTROL_TTL_S = 0.5
#: How long one read of the writer may take; meanwhile other callers get the last value (seconds).
READ_TIMEOUT_S = 10.0


class ControlRelay:
    """The writer's controls as this node last read them; one read per :data:`CONTROL_TTL_S` at most."""

    def __init__(self, ttl: float = CONTROL_TTL_S) -> None:
        self.ttl = ttl
        self.reads = 0
        self.served = 0
        self._writer: Any = None
        self._value: dict[str, Any] | None = None
        self._at = float("-inf")
        self._lock = threading.Lock()

    def get(self) -> dict[str, Any]:
        """The controls; raises when the writer cannot be read (the worker then tries again next poll)."""
        import ray

        self.served += 1
        value = self._value
        if value is not None and (time.monotonic() - self._at < self.ttl or self._lock.locked()):
            return dict(value)  # fresh, or another caller is reading the writer now: no second read, no wait
        with self._lock:
            if self._value is not None and time.monotonic() - self._at < self.ttl:
                return dict(self._value)
            try:
                if self._writer is None:
                    self._writer = ray.get_actor(WRITER_NAME, namespace=NAMESPACE)
                value = ray.get(self._writer.get_controls.remote(), timeout=READ_TIMEOUT_S)
            except Exception:
                self._writer = None  # gone or replaced: look it up again
                raise
            self.reads += 1
            self._value, self._at = dict(value), time.monotonic()
            return dict(value)

    def totals(self) -> dict[str, int]:
        """Polls served to workers and writer reads made."""
        return {"served": self.served, "reads": self.reads}
