"""An agent relays the writer's controls to its node's workers: one writer poll per node, not per worker.

Every worker's control thread (:mod:`raysleuth.control`) polls once a
second. Polling the writer directly put one RPC a second per rank on one
actor (1,000 a second at 1,000 ranks, measured by ``bench/bench_ingest.py``).
Workers poll their own node's agent instead (a call on the same node); the
agent reads the writer at most once per :data:`CONTROL_TTL_S` for all of
them, so the writer sees about one poll a second per node. A change reaches
a worker within ``CONTROL_TTL_S`` plus one poll interval. While a slow read
of the writer is under way, the agent serves what it last read only while
that is younger than :data:`STALE_LIMIT_S`; past it, it answers ``None``
("nothing fresh yet"), and the worker keeps what it has: a worker never
applies a control the writer had already replaced seconds before (a new
worker disarmed by a ``debug disarm`` that ``reset`` had undone).

The same for consistency meetings: a rank waiting for its peers polls how
many have posted through its node's agent (:class:`CountRelay`), which reads
the writer once per topic per :data:`COUNT_TTL_S` for the node.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from raysleuth.cluster.own import AGENT_PREFIX, NAMESPACE, WRITER_NAME

__all__ = ["CONTROL_TTL_S", "COUNT_TTL_S", "READ_TIMEOUT_S", "STALE_LIMIT_S", "ControlRelay", "CountRelay",
           "node_agent"]

#: How long an agent serves the controls it last read before it reads the writer again (seconds).
CONTROL_TTL_S = 0.5
#: How long an agent serves a meeting topic's count before it reads the writer again (seconds).
COUNT_TTL_S = 0.1
#: How long one read of the writer may take; meanwhile other callers get the last value (seconds).
READ_TIMEOUT_S = 10.0
#: The oldest controls an agent serves while another read of the writer is under way (seconds, from the
#: start of the read that got them); older, it answers None and the worker asks again at its next poll.
STALE_LIMIT_S = 2 * CONTROL_TTL_S


def node_agent(ray: Any, method: str) -> Any:
    """This process's node agent when it exists and has ``method`` (one from an older raysleuth may not);
    else None (the caller then asks the writer)."""
    try:
        agent = ray.get_actor(AGENT_PREFIX + ray.get_runtime_context().get_node_id()[:16], namespace=NAMESPACE)
        getattr(agent, method)  # AttributeError: no such method on that agent
        return agent
    except (ValueError, AttributeError):
        return None


class _WriterReads:
    """A node's reads of the writer on behalf of its workers (looked up once, again after a failure)."""

    def __init__(self) -> None:
        self.reads = 0
        self.served = 0
        self._writer: Any = None
        self._lock = threading.Lock()

    def _read(self, method: str, *args: Any) -> Any:
        import ray

        try:
            if self._writer is None:
                self._writer = ray.get_actor(WRITER_NAME, namespace=NAMESPACE)
            value = ray.get(getattr(self._writer, method).remote(*args), timeout=READ_TIMEOUT_S)
        except Exception:
            self._writer = None  # gone or replaced: look it up again
            raise
        self.reads += 1
        return value

    def totals(self) -> dict[str, int]:
        """Calls served to workers and writer reads made."""
        return {"served": self.served, "reads": self.reads}


class ControlRelay(_WriterReads):
    """The writer's controls as this node last read them; one read per :data:`CONTROL_TTL_S` at most."""

    def __init__(self, ttl: float = CONTROL_TTL_S, stale_limit: float = STALE_LIMIT_S) -> None:
        super().__init__()
        self.ttl = ttl
        self.stale_limit = stale_limit
        self._value: dict[str, Any] | None = None
        self._at = float("-inf")  # when the read that got _value started: the writer's state is no older

    def get(self) -> dict[str, Any] | None:
        """The controls, or None while another read of the writer is under way and what this node has is older
        than ``stale_limit`` (the worker keeps its own and asks again at its next poll). Raises when the writer
        cannot be read (the worker then tries again next poll)."""
        self.served += 1
        value, age = self._value, time.monotonic() - self._at
        if value is not None and age < self.ttl:
            return dict(value)
        if not self._lock.acquire(blocking=False):  # another caller is reading the writer now: never a second read
            return dict(value) if value is not None and age < self.stale_limit else None
        try:
            if self._value is not None and time.monotonic() - self._at < self.ttl:
                return dict(self._value)
            started = time.monotonic()
            value = dict(self._read("get_controls"))
            self._value, self._at = value, started
            return dict(value)
        finally:
            self._lock.release()


class CountRelay(_WriterReads):
    """How many ranks posted under a meeting's topic, as this node last read it: one writer read per topic per
    :data:`COUNT_TTL_S` for all the node's waiting ranks (:class:`raysleuth.consistency.exchange.MailboxExchange`)."""

    def __init__(self, ttl: float = COUNT_TTL_S) -> None:
        super().__init__()
        self.ttl = ttl
        self._counts: dict[str, tuple[int, float]] = {}

    def get(self, topic: str) -> int:
        """The count; raises when the writer cannot be read."""
        self.served += 1
        with self._lock:
            hit = self._counts.get(topic)
            if hit is not None and time.monotonic() - hit[1] < self.ttl:
                return hit[0]
            count = int(self._read("count", topic))
            now = time.monotonic()
            if len(self._counts) >= 1024:  # meetings long over
                self._counts = {key: item for key, item in self._counts.items() if now - item[1] < 60.0}
            self._counts[topic] = (count, now)
            return count
