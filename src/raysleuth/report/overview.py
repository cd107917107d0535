"""The report's dense sections read as aggregates in SQL, and summarised when there are many ranks.

Memory curves are one point per worker and time bucket (the highest RSS in
it, ``MAX`` in SQL); step phases are one total per step, rank and phase
(``SUM`` in SQL). Up to :data:`ALONE` workers each gets its own curve. Past
that the charts show the ranks as one group (lowest, median and highest per
bucket or step) plus the ranks that stand out alone (leaks, the highest
peaks, stragglers); every rank's numbers stay in the section's data and
tables. So a 1,000-rank run makes a page of the same size as a 16-rank one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from raysleuth.options import format_ranks
from raysleuth.recorder.blocks import rss_buckets
from raysleuth.recorder.reading import span_totals
from raysleuth.report import sections

__all__ = ["ALONE", "memory_curves", "span_overview"]

ALONE = 16
"""Up to this many workers (ranks) every one is drawn alone."""
BUCKETS = 120
"""Time buckets of a memory curve."""


def _band(series: dict[Any, dict[Any, float]]) -> dict[str, Any]:
    """Lowest, median and highest across series, per shared x."""
    by_x: dict[Any, list[float]] = defaultdict(list)
    for points in series.values():
        for x, y in points.items():
            by_x[x].append(y)
    xs = sorted(by_x)
    return {"x": xs, "low": [min(by_x[x]) for x in xs], "median": [round(statistics.median(by_x[x]), 4) for x in xs],
            "high": [max(by_x[x]) for x in xs], "count": len(series)}


def _step_band(steps: list, columns: list[list[float | None]]) -> dict[str, Any] | None:
    """:func:`_band` of step totals (one list per rank, None: no total that step) in numpy; None when a total is
    NaN (numpy would not tell it from None) or not a number."""
    import numpy as np

    try:
        table = np.array(columns, dtype=np.float64).reshape(len(columns), len(steps))
    except (TypeError, ValueError):
        return None
    if int(np.isnan(table).sum()) != sum(column.count(None) for column in columns):
        return None
    seen = np.flatnonzero(~np.isnan(table).all(axis=0))
    table = table[:, seen]
    return {"x": [steps[column] for column in seen.tolist()],
            "low": np.nanmin(table, axis=0).tolist(),
            "median": [round(value, 4) for value in np.nanmedian(table, axis=0).tolist()],
            "high": np.nanmax(table, axis=0).tolist(), "count": len(columns)}


def memory_curves(store, leaking: set) -> dict[str, Any]:
    """``curves`` (label -> x, y) drawn alone, and ``band`` for the rest when there are many workers."""
    first = next(store.select("memory", ("time",), limit=1), None)
    last = next(store.select("memory", ("time",), limit=1, newest_first=True), None)
    if first is None or last is None:
        return {"curves": {}, "band": None, "grouped": ""}
    start, width = first[0], max(1.0, (last[0] - first[0]) / BUCKETS)
    curves: dict[str, dict[str, list]] = {}
    peaks: dict[str, float] = {}
    ranks: dict[str, Any] = {}
    writer = None
    for rank, pid, _bucket, when, value in rss_buckets(store, width, start=start):
        if writer != (rank, pid):  # the rows come worker by worker
            writer, label = (rank, pid), sections.rank_label(rank) + (f" · pid {pid}" if pid else "")
            curve = curves.setdefault(label, {"x": [], "y": []})
            xs, ys = curve["x"], curve["y"]
            ranks[label] = rank
        xs.append(round(when - start, 3))
        y = round(value / 2**20, 2)
        ys.append(y)
        peaks[label] = max(peaks.get(label, 0.0), y)
    if len(curves) <= ALONE:
        return {"curves": dict(sorted(curves.items())), "band": None, "grouped": ""}
    alone = {label for label in curves if ranks[label] in leaking}
    alone |= set(sorted(peaks, key=lambda label: -peaks[label])[:3])
    rest = {label: dict(zip([round(x / width) for x in curve["x"]], curve["y"]))
            for label, curve in curves.items() if label not in alone}
    band = _band(rest)
    band["x"] = [round(x * width, 3) for x in band["x"]]
    grouped = (f"{len(rest)} workers (ranks {format_ranks(r for l, r in ranks.items() if l in rest and r is not None)})"
               f" drawn as one band: lowest, median and highest RSS per {width:.0f} s; drawn alone: leaks and the "
               "three highest peaks")
    return {"curves": {label: curves[label] for label in sorted(alone)}, "band": band, "grouped": grouped}


def span_overview(store) -> dict[str, Any]:
    """:func:`sections.span_section` from per-step totals summed in SQL, with a band when there are many ranks."""
    section = sections.span_section(span_totals(store))
    section["band"], section["alone"], section["grouped"] = None, section["ranks"], ""
    if len(section["ranks"]) <= ALONE:
        return section
    alone = sorted({straggler["rank"] for straggler in section["stragglers"]})[:ALONE]
    others = [rank for rank in section["ranks"] if rank not in alone]
    band = _step_band(section["steps"], [section["totals"][rank] for rank in others])
    if band is None:
        band = _band({rank: {step: value for step, value in zip(section["steps"], section["totals"][rank])
                             if value is not None} for rank in others})
    section["band"], section["alone"] = band, alone
    section["grouped"] = (f"{len(others)} ranks ({format_ranks(others)}) drawn as one band: the fastest, median and "
                          "slowest step per step; drawn alone: the stragglers")
    return section
