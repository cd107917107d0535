"""The report's step section from span totals as numpy columns (:func:`span_arrays`): the same section, to the
bit, as :func:`raysleuth.report.sections.span_section` makes of the rows."""

from __future__ import annotations

from typing import Any

from raysleuth.report.rounding import mean_rounded, python_round
from raysleuth.timeline.summary import STRAGGLER_RATIO

__all__ = ["span_arrays", "span_table"]


def span_arrays(step_of, rank_of, phase_of, ordered: list[str], values) -> dict[str, Any] | None:
    """:func:`span_section` of totals as numpy columns (``totals.span_columns``: int64 steps, ranks and codes into
    the sorted phase names ``ordered``, float64 seconds), or None when they are not SQL's shape (a key not above
    the one before, a value not finite, a table too sparse): then the rows' path, on the same totals as tuples."""
    return span_table(step_of, rank_of, phase_of, ordered, values)[0]


def span_table(step_of, rank_of, phase_of, ordered: list[str], values) -> tuple[dict[str, Any] | None, Any]:
    """(:func:`span_arrays`' section, its step totals as a (steps, ranks) float64 array, rounded as the section's,
    NaN for no total: the report's band reads them so; (None, None) where :func:`span_arrays` gives None)."""
    import math

    import numpy as np

    if not len(values) or not np.isfinite(values).all():
        return None, None
    step_step, rank_step, phase_step = np.diff(step_of), np.diff(rank_of), np.diff(phase_of)
    if not ((step_step > 0) | ((step_step == 0) & ((rank_step > 0) | ((rank_step == 0) & (phase_step > 0))))).all():
        return None, None
    first_of_step = np.concatenate(([True], step_step != 0))  # the steps come in order: each one's first row
    step_list, s = step_of[first_of_step], np.cumsum(first_of_step) - 1
    rank_list, r = _places(rank_of, np)
    if len(step_list) * len(rank_list) * len(ordered) > 8 * len(values) + 4096:
        return None, None  # sparse (ranks counting steps of their own): a dense table would not fit; the rows' dicts do
    cube = np.zeros((len(step_list), len(rank_list), len(ordered)))
    cube[s, r, phase_of] += values  # 0.0 + x, as the rows' loop adds: -0.0 becomes 0.0
    present = np.zeros((len(step_list), len(rank_list)), dtype=bool)
    present[s, r] = True
    total = cube[:, :, 0]
    for phase in range(1, len(ordered)):  # in phase order, one at a time (numpy's pairwise sum would differ)
        total = total + cube[:, :, phase]
    steps_out, ranks_out = step_list.tolist(), rank_list.tolist()
    totals = python_round(total, 4)
    step_totals: dict[Any, list[float | None]] = {}
    mean_phase: dict[Any, dict[str, float]] = {}
    dense = bool(present.all())
    if dense:  # every rank in every step: each rank's row of totals, and its means of each phase, in one call
        by_rank, means = totals.T.tolist(), [mean_rounded(cube[:, :, phase], 4) for phase in range(len(ordered))]
        for column, rank in enumerate(ranks_out):
            step_totals[rank] = by_rank[column]
            mean_phase[rank] = {name: means[phase][column] for phase, name in enumerate(ordered)}
    for column, rank in enumerate(ranks_out if not dense else ()):
        seen = present[:, column]
        rounded = totals[:, column].tolist()  # rounded as round(value, 4), all at once
        step_totals[rank] = rounded if seen.all() else [value if here else None
                                                        for value, here in zip(rounded, seen.tolist())]
        rows = cube[seen, column, :]
        mean_phase[rank] = {name: round(math.fsum(rows[:, phase].tolist()) / len(rows), 4)
                            for phase, name in enumerate(ordered)}
    stragglers: list[dict[str, Any]] = []
    judged = [phase for phase, name in enumerate(ordered) if not name.startswith("ray.call:")]
    if judged and dense:  # every rank in every step: each step's medians and slowest at once
        if len(ranks_out) >= 2:
            here = cube[:, :, judged]
            medians, slowest = np.median(here, axis=1), here.argmax(axis=1)
            highest = np.take_along_axis(here, slowest[:, None, :], axis=1)[:, 0, :]
            ratios = np.divide(highest, medians, out=np.ones_like(highest), where=medians > 0)
            for row, column in np.argwhere(ratios >= STRAGGLER_RATIO).tolist():  # by step, then phase
                _straggler(stragglers, steps_out[row], int(rank_list[slowest[row, column]]), ordered[judged[column]],
                           highest[row, column], medians[row, column], ratios[row, column], step_totals, row)
        judged = []
    for row, step in enumerate(steps_out if judged else ()):
        seen_ranks = rank_list[present[row]]
        here = cube[row][present[row]][:, judged]  # the ranks seen in this step, 0.0 for a phase they did not record
        if len(here) < 2:
            continue
        medians, slowest = np.median(here, axis=0), here.argmax(axis=0)
        highest = here[slowest, np.arange(len(judged))]
        ratios = np.divide(highest, medians, out=np.ones_like(highest), where=medians > 0)
        for column in np.flatnonzero(ratios >= STRAGGLER_RATIO).tolist():
            _straggler(stragglers, step, int(seen_ranks[slowest[column]]), ordered[judged[column]], highest[column],
                       medians[column], ratios[column], step_totals, row)
    if not dense:
        totals[~present] = np.nan
    return ({"steps": steps_out, "ranks": ranks_out, "phases": ordered, "totals": step_totals,
             "mean_phase": mean_phase, "stragglers": stragglers}, totals)


def _places(values, np) -> tuple:
    """(the sorted distinct ``values``, each value's place among them): ``np.unique`` and ``searchsorted``, or, for
    values within a short range (ranks), a table of that range instead of two sorts of every value."""
    low, high = int(values.min()), int(values.max())
    if high - low > 4 * len(values) + 1024:
        distinct = np.unique(values)
        return distinct, np.searchsorted(distinct, values)
    seen = np.zeros(high - low + 1, dtype=bool)
    seen[values - low] = True
    return np.flatnonzero(seen) + low, (np.cumsum(seen) - 1)[values - low]


def _straggler(found: list, step: Any, rank: int, phase: str, seconds: Any, median: Any, ratio: Any,
               step_totals: dict, row: int) -> None:
    found.append({"step": step, "rank": rank, "phase": phase, "seconds": round(float(seconds), 4),
                  "median": round(float(median), 4), "ratio": round(float(ratio), 2),
                  "step_seconds": step_totals[rank][row]})

