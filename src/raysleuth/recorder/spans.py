"""The spans' hot path: one deque of plain fields that ``rs.span`` extends and the process client drains."""

from __future__ import annotations

import collections
from typing import Any, Callable

__all__ = ["DRAINER", "SPANS", "SPAN_CAPACITY", "SPAN_FIELDS", "SPAN_WAKE", "forget_spans", "register_lazy_data",
           "span_dropped"]

#: Spans waiting for the process client's thread: ``rs.span`` extends it by its :data:`SPAN_FIELDS` plain
#: values (one ``extend``, atomic under the GIL: no object the garbage collector follows is kept per span,
#: which measured 0.4 µs a span in collections in a worker's heap), and the client that drains them
#: (``DRAINER[0]``, the process client once its thread runs) makes the rows, with their rank and sequence
#: number, off the traced thread. Bounded: past ``SPAN_CAPACITY`` spans one is dropped and counted
#: (``span_dropped``), like any record the client's buffer has no room for.
SPANS: collections.deque = collections.deque()
SPAN_FIELDS = 10
"""start, end, step, name, span id, parent id, attrs, thread, error, the rank cache the span saw."""
SPAN_CAPACITY = 100_000
#: A batch's worth: the span that finds this many waiting wakes the drainer at once.
SPAN_WAKE = 5_000
DRAINER: list[Any] = [None]
"""The :class:`~raysleuth.recorder.client.RecordClient` that drains :data:`SPANS` (None: the next span finds it)."""
_span_drops = [0]


def span_dropped() -> None:
    """Count a span :data:`SPANS` had no room for (the drainer adds it to its ``stats.dropped``)."""
    _span_drops[0] += 1


def forget_spans() -> None:
    """A forked child: the parent's waiting spans are the parent's to deliver, and no client drains here yet."""
    SPANS.clear()
    DRAINER[0] = None
    _span_drops[0] = 0


_lazy_data: dict[str, Callable[[tuple], dict[str, Any]]] = {}


def register_lazy_data(kind: str, build: Callable[[tuple], dict[str, Any]]) -> None:
    """Rows of ``kind`` whose data is a plain tuple get their dict from ``build(tuple)`` when the client takes them."""
    _lazy_data[kind] = build
