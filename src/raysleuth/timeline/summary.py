"""The straggler view: per step and phase, each rank's time, the slowest rank and its lag behind the median."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from raysleuth.recorder import open_store
from raysleuth.timeline.model import StepPhase, _number


def summarize_steps(spans: list[dict[str, Any]]) -> list[StepPhase]:
    """Straggler view from plain spans ``{"step", "name", "rank", "pid", "duration_s"}`` (pure).

    Durations of a phase are summed per rank within a step; a step's phase
    seen on one rank only still gets a row (lag 0).
    """
    return _summarize_rows((span.get("step"), span.get("name"), span.get("rank"), span.get("pid"),
                            span.get("duration_s")) for span in spans)


def _summarize_rows(rows: Iterable[tuple]) -> list[StepPhase]:
    """:func:`summarize_steps` over (step, name, rank, pid, duration_s) tuples.

    Each (step, name) as read is looked up once: the rows after it find their (step, phase)'s durations in one
    dict hit (a 1,000-rank hour: 299,000 rows, 300 of those)."""
    grouped: dict[tuple[int, str], dict[str, float]] = {}
    cells: dict[tuple, dict[str, float] | None] = {}  # (step, name) -> its durations per rank; None: left out
    ranks: dict[Any, str] = {}
    for step, name, rank, pid, duration in rows:
        if step is None:
            continue
        cell = cells.get((step, name), _UNSEEN)
        if cell is _UNSEEN:
            cell = cells[(step, name)] = _cell(grouped, step, name)
        if cell is None:
            continue
        who = ranks.get(rank) if rank is not None else f"pid {pid}"
        if who is None:
            who = ranks[rank] = str(rank)
        cell[who] = cell.get(who, 0.0) + (duration if type(duration) is float and duration - duration == 0
                                          else _number(duration, 0.0))
    return phase_rows(grouped)


_UNSEEN: Any = object()


def _cell(grouped: dict[tuple[int, str], dict[str, float]], step: Any, name: Any) -> dict[str, float] | None:
    """The durations per rank of ``name``'s phase in ``step``; None for a Ray call (not a phase)."""
    if str(name if name is not None else "").startswith("ray.call:"):
        return None
    return grouped.setdefault((int(step), str(name)), {})


def phase_rows(grouped: dict[tuple[int, str], dict[str, float]]) -> list[StepPhase]:
    """The :class:`StepPhase` rows of seconds grouped per (step, phase) and rank (``"3"``), in (step, phase) order.

    Among ranks as slow as each other the first in ``grouped`` order is the slowest.
    """
    result = []
    for (step, phase), durations in sorted(grouped.items()):
        median = statistics.median(durations.values())
        slowest = max(durations, key=durations.__getitem__)
        lag = durations[slowest] - median
        result.append(StepPhase(step=step, phase=phase, durations=dict(sorted(durations.items())), median_s=median,
                                slowest=slowest, slowest_s=durations[slowest], lag_s=lag,
                                lag_ratio=(durations[slowest] / median) if median > 0 else 1.0))
    return result


def timeline_summary(*, run: str | None = None, home: Path | str | None = None,
                     steps: tuple[int | None, int | None] | None = None, ranks: list[int] | None = None,
                     jobs: list[str] | None = None, since: float | None = None,
                     until: float | None = None) -> list[StepPhase]:
    """Per step and phase: each rank's duration, the slowest rank and its lag behind the median.

    Reads five fields a span in SQL, streamed (no record is built), rank by rank: a rank's rows lie
    together in the file, and each rank's durations are still summed in time order.
    """
    store = open_store(run, home=home)
    step_min, step_max = steps if steps else (None, None)
    try:
        return _summarize_rows(store.select("span", ("step", "name", "rank", "pid"), ("duration_s",), order="rank", rank=ranks,
                                            job=jobs, step_min=step_min, step_max=step_max, since=since,
                                            until=until))
    finally:
        store.close()


#: The straggler rule of the timeline and the report: the slowest rank of a step's phase took this many times the
#: median of the ranks (``raysleuth timeline --summary`` marks it, the report lists it).
STRAGGLER_RATIO = 1.5


def phases_from_totals(totals: Iterable[tuple[int, str, Any, float]]) -> list[StepPhase]:
    """:func:`summarize_steps` over (step, phase, rank, seconds) totals (pure)."""
    return _summarize_rows((step, phase, rank, None, seconds) for step, phase, rank, seconds in totals)


def stragglers_of(rows: Iterable[StepPhase], ratio: float = STRAGGLER_RATIO) -> list[StepPhase]:
    """The step phases whose slowest rank took at least ``ratio`` times the median of two or more ranks."""
    return [row for row in rows if len(row.durations) > 1 and row.lag_ratio >= ratio]
