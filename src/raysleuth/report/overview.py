"""The report's dense sections read as aggregates, and summarised when there are many ranks.

Memory curves are one point per worker and time bucket (the highest RSS in
it: from the memory blocks' columns in numpy, else ``MAX`` in SQL); step
phases are one total per step, rank and phase (the spans summed in numpy,
else ``SUM`` in SQL). Up to :data:`ALONE` workers each gets its own curve. Past
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
from raysleuth.recorder.blocks import NULL, RssRuns, bucket_rows, rss_bucket_columns
from raysleuth.recorder.reading import buckets
from raysleuth.recorder.totals import span_columns, span_rows, span_totals
from raysleuth.report import sections
from raysleuth.report.rounding import python_round
from raysleuth.report.step_arrays import span_table

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


def _step_band(steps: list, columns: list[list[float | None]], table: Any = None) -> dict[str, Any] | None:
    """:func:`_band` of step totals (one list per rank, None: no total that step) in numpy; None when a total is
    NaN (numpy would not tell it from None) or not a number. ``table``: the totals already as a (ranks, steps)
    float64 array, NaN for no total (``columns`` then unread)."""
    import numpy as np

    if table is None:
        try:
            table = np.array(columns, dtype=np.float64).reshape(len(columns), len(steps))
        except (TypeError, ValueError):
            return None
        missing = np.isnan(table)
        if missing.any() and int(missing.sum()) != sum(column.count(None) for column in columns):
            return None
    else:
        missing = np.isnan(table)
    if not missing.any():  # every rank has a total every step (None would be NaN): numpy's own, not its nan* loops
        return {"x": list(steps), "low": table.min(axis=0).tolist(),
                "median": [round(value, 4) for value in np.median(table, axis=0).tolist()],
                "high": table.max(axis=0).tolist(), "count": len(table)}
    seen = np.flatnonzero(~missing.all(axis=0))
    table = table[:, seen]
    return {"x": [steps[column] for column in seen.tolist()],
            "low": np.nanmin(table, axis=0).tolist(),
            "median": [round(value, 4) for value in np.nanmedian(table, axis=0).tolist()],
            "high": np.nanmax(table, axis=0).tolist(), "count": len(table)}


def curve_frame(store) -> tuple[float, float] | None:
    """(the first sample's time, a bucket's seconds) of the memory curves; None: no sample."""
    first = next(store.select("memory", ("time",), limit=1), None)
    last = next(store.select("memory", ("time",), limit=1, newest_first=True), None)
    if first is None or last is None:
        return None
    return first[0], max(1.0, (last[0] - first[0]) / BUCKETS)


def memory_curves(store, leaking: set, runs: RssRuns | None = None) -> dict[str, Any]:
    """``curves`` (label -> x, y) drawn alone, and ``band`` for the rest when there are many workers. ``runs``: the
    blocks' runs another reader folded in the same snapshot (``rss_bucket_columns``), for the frame it was made
    with (:func:`curve_frame`, not asked again)."""
    frame = (runs.start, runs.width) if runs is not None else curve_frame(store)
    if frame is None:
        return {"curves": {}, "band": None, "grouped": ""}
    start, width = frame
    columns = rss_bucket_columns(store, width, start=start, runs=runs)
    if columns is None:  # SQLite's own buckets
        return _curve_rows(buckets(store, "memory", "rss_bytes", width, start=start), leaking, start, width)
    drawn = _curve_columns(columns, leaking, start, width)
    return drawn if drawn is not None else _curve_rows(bucket_rows(columns), leaking, start, width)


def _curve_rows(buckets, leaking: set, start: float, width: float) -> dict[str, Any]:
    """:func:`memory_curves` from the buckets a row at a time."""
    curves: dict[str, dict[str, list]] = {}
    peaks: dict[str, float] = {}
    ranks: dict[str, Any] = {}
    writer = None
    for rank, pid, _bucket, when, value in buckets:
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
    return _drawn(curves, _band(rest), [ranks[label] for label in rest], alone, width)


def _drawn(curves: dict[str, dict[str, list]], band: dict[str, Any], rest: list, alone: set, width: float,
           ) -> dict[str, Any]:
    """The curves drawn alone, the band of the ``rest`` (their ranks) with its x in seconds, and the line saying so."""
    band["x"] = [round(x * width, 3) for x in band["x"]]
    grouped = (f"{len(rest)} workers (ranks {format_ranks(r for r in rest if r is not None)})"
               f" drawn as one band: lowest, median and highest RSS per {width:.0f} s; drawn alone: leaks and the "
               "three highest peaks")
    return {"curves": {label: curves[label] for label in sorted(alone)}, "band": band, "grouped": grouped}


def _curve_columns(columns: tuple, leaking: set, start: float, width: float) -> dict[str, Any] | None:
    """:func:`_curve_rows` from :func:`~raysleuth.recorder.blocks.rss_bucket_columns`' arrays: the same answer, to
    the bit, with the band's lowest, median and highest per bucket taken in numpy. None (the rows' loop then)
    when two workers would share a label, or a value is too large for numpy's rounding to be Python's."""
    import numpy as np

    ranks, pids, _bucket, when, value = columns
    if not len(ranks) or np.abs(value).max() >= 2**46:  # below: value / 2**20 * 100 is exact, so is np.round
        return None if len(ranks) else {"curves": {}, "band": None, "grouped": ""}
    starts = np.flatnonzero(np.concatenate(([True], (np.diff(ranks) != 0) | (np.diff(pids) != 0))))
    ends = np.append(starts[1:], len(ranks))
    labels, who = [], []
    for rank, pid in zip(ranks[starts].tolist(), pids[starts].tolist()):
        rank, pid = None if rank == NULL else rank, None if pid == NULL else pid
        labels.append(sections.rank_label(rank) + (f" · pid {pid}" if pid else ""))
        who.append(rank)
    if len(set(labels)) < len(labels):  # (rank 3, pid None) and (rank 3, pid 0): one curve in the rows' loop
        return None
    xs = python_round(when - start, 3).tolist()  # [round(at - start, 3) for at in when.tolist()], at once
    mib = np.round(value / 2**20, 2)
    ys = mib.tolist()
    peaks = dict(zip(labels, np.maximum(np.maximum.reduceat(mib, starts), 0.0).tolist()))
    bounds = list(zip(starts.tolist(), ends.tolist()))
    curves = {label: {"x": xs[a:b], "y": ys[a:b]} for label, (a, b) in zip(labels, bounds)}
    if len(curves) <= ALONE:
        return {"curves": dict(sorted(curves.items())), "band": None, "grouped": ""}
    alone = {label for label, rank in zip(labels, who) if rank in leaking}
    alone |= set(sorted(peaks, key=lambda label: -peaks[label])[:3])
    inside = np.ones(len(ranks), dtype=bool)
    for label, (a, b) in zip(labels, bounds):
        if label in alone:
            inside[a:b] = False
    keys = np.rint(np.array(xs) / width).astype(np.int64)  # Python's round: to even, as rint
    worker = np.repeat(np.arange(len(starts)), ends - starts)
    if (np.diff(keys)[worker[1:] == worker[:-1]] < 0).any():
        return None  # a key that falls back along a worker (the buckets' first times come in order: never)
    # a worker's points with one key: the last is kept (a dict's update); the keys rise along a worker
    last = np.append((worker[1:] != worker[:-1]) | (keys[1:] != keys[:-1]), True)
    keys, points = keys[inside & last], mib[inside & last]
    order = np.lexsort((points, keys))
    keys, points = keys[order], points[order]
    first = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    counts = np.diff(np.append(first, len(keys)))
    middle = first + counts // 2
    median = np.where(counts % 2 == 1, points[middle], (points[middle - 1 + counts % 2] + points[middle]) / 2)
    band = {"x": keys[first].tolist(), "low": points[first].tolist(),
            "median": [round(m, 4) for m in median.tolist()], "high": points[first + counts - 1].tolist(),
            "count": len(labels) - len(alone)}
    rest = [rank for label, rank in zip(labels, who) if label not in alone]
    return _drawn(curves, band, rest, alone, width)


def span_overview(store) -> dict[str, Any]:
    """:func:`sections.span_section` of the per-step totals (:func:`~raysleuth.recorder.totals.span_columns`
    summed in numpy, else in SQL), with a band when there are many ranks."""
    columns = span_columns(store)
    section, table = span_table(*columns) if columns is not None else (None, None)
    if section is None:
        section = sections.span_section(span_rows(columns) if columns is not None else span_totals(store))
    section["band"], section["alone"], section["grouped"] = None, section["ranks"], ""
    if len(section["ranks"]) <= ALONE:
        return section
    alone = sorted({straggler["rank"] for straggler in section["stragglers"]})[:ALONE]
    others = [rank for rank in section["ranks"] if rank not in alone]
    kept = None if table is None else [at for at, rank in enumerate(section["ranks"]) if rank not in alone]
    band = _step_band(section["steps"], [section["totals"][rank] for rank in others] if table is None else [],
                      None if table is None else table[:, kept].T)
    if band is None:
        band = _band({rank: {step: value for step, value in zip(section["steps"], section["totals"][rank])
                             if value is not None} for rank in others})
    section["band"], section["alone"] = band, alone
    section["grouped"] = (f"{len(others)} ranks ({format_ranks(others)}) drawn as one band: the fastest, median and "
                          "slowest step per step; drawn alone: the stragglers")
    return section
