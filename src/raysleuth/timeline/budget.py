"""The trace's budget: past :data:`TRACE_LIMIT` records a plain ``timeline -o`` keeps the newest that fit, and says so.

A 1,000-rank hour holds about a million records (300k spans, 300k heartbeats, 360k memory samples): a
155 MB trace that takes many seconds to write and more to load. Unless the caller asks for everything
(``limit=None``, ``raysleuth timeline -o --all``), the trace starts at the time from which the selection's
newest records fit the budget; the timeline records where it starts and how many records it left out
(:attr:`Timeline.cut_since`, :attr:`Timeline.left_out`) and warns in words, in the file too. Nothing is cut
from a run that fits.
"""

from __future__ import annotations

import datetime as _dt

from raysleuth.recorder.counting import count_span
from raysleuth.timeline.model import Timeline

__all__ = ["TRACE_LIMIT", "cut_to_budget"]

TRACE_LIMIT = 100_000
"""Records (spans, events, heartbeats, memory samples) a trace holds unless everything is asked for."""

_STEPPED = ("span", "event", "heartbeat")


def _count(store, since, *, ranks, jobs, steps, until) -> tuple[int, float | None, float | None]:
    """(records, first, last) of the trace's selection from ``since``; with ``steps`` the memory samples are
    not counted (they follow the steps' time window)."""
    step_min, step_max = steps if steps else (None, None)
    count, first, last = count_span(store, _STEPPED, rank=ranks, job=jobs, since=since, until=until,
                                    step_min=step_min, step_max=step_max)
    if steps is None:
        more, low, high = count_span(store, "memory", rank=ranks, job=jobs, since=since, until=until)
        count += more
        first = low if first is None else (first if low is None else min(first, low))
        last = high if last is None else (last if high is None else max(last, high))
    return count, first, last


def cut_to_budget(store, timeline: Timeline, limit: int, *, ranks=None, jobs=None, steps=None, since=None,
                  until=None) -> float | None:
    """The ``since`` the trace reads from: the caller's, or later so that at most ``limit`` records are read."""
    total, first, last = _count(store, since, ranks=ranks, jobs=jobs, steps=steps, until=until)
    if total <= limit or first is None or last is None:
        return since
    cut, kept = first, total
    for _ in range(12):  # records come at a steady rate in training: a guess from the rate, checked in SQL
        cut = last - (last - cut) * min(0.98, 0.98 * limit / kept)
        kept = _count(store, cut, ranks=ranks, jobs=jobs, steps=steps, until=until)[0]
        if kept <= limit:
            break
    else:
        cut, kept = last, _count(store, last, ranks=ranks, jobs=jobs, steps=steps, until=until)[0]
    timeline.cut_since, timeline.left_out = cut, total - kept
    when = _dt.datetime.fromtimestamp(cut).strftime("%Y-%m-%d %H:%M:%S")
    timeline.warnings.append(
        f"the selection holds {total:,} records (spans, events, heartbeats, memory samples), more than a trace's "
        f"{limit:,}: this trace keeps the newest {kept:,}, from {when} (the last {(last - cut) / 60:.1f} of "
        f"{(last - first) / 60:.1f} minutes), and leaves {total - kept:,} out. Every record: --all; "
        "or pick with --since/--until, --ranks, --steps")
    return cut
