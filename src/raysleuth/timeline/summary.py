"""The straggler view: per step and phase, each rank's time, the slowest rank and its lag behind the median."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from raysleuth.recorder import blocks, open_store, span_blocks
from raysleuth.recorder.conditions import SPAN_UNBLOCKED
from raysleuth.recorder.reading import _listed
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
    if _is_ray_call(name):
        return None
    return grouped.setdefault((int(step), str(name)), {})


def _is_ray_call(name: Any) -> bool:
    """A span of a Ray call (``ray.call:Worker.step``), which is no phase of a step."""
    return str(name if name is not None else "").startswith("ray.call:")


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
        if since is None and until is None:  # blocks hold no times: a time cut reads every span as a row
            grouped = _grouped_from_blocks(store, ranks, jobs, step_min, step_max)
            if grouped is not None:
                return phase_rows(grouped)
        return _summarize_rows(store.select("span", ("step", "name", "rank", "pid"), ("duration_s",), order="rank", rank=ranks,
                                            job=jobs, step_min=step_min, step_max=step_max, since=since,
                                            until=until))
    finally:
        store.close()


def _grouped_from_blocks(store, ranks, jobs, step_min, step_max) -> dict | None:
    """What :func:`_summarize_rows` groups (seconds per (step, phase), then per rank, in its insertion order), from
    the span blocks of the writer's passes (a full-mode 1,000-rank hour: 1.2 million spans, 2.3 of the 2.6 CPU s
    read row by row) and, row by row, the spans no block holds as written (schema 9's ``span_unblocked``, those
    above the newest pass and those of passes made before schema 7). None where these cannot say it exactly (a
    file before schema 9, no pass yet, a step or rank that is not an int, a name that is not text): the rows then.

    Each rank's seconds are summed as the rows are read, rank by rank in time order: a key held by one span is
    0.0 plus its seconds; a repeated key (a phase entered twice in a step) is summed in Python in (time, id) order.
    """
    import numpy as np

    if store.schema_version < 9:
        return None
    jobs = None if jobs is None else _listed(jobs)
    filters = {"rank": ranks, "job": jobs, "step_min": step_min, "step_max": step_max}
    with blocks.snapshot(store):
        sealed = span_blocks.read(store, jobs)
        if sealed is None:
            return None
        clauses = [("id > ?", [sealed.high]), *(("id > ? AND id <= ?", [lo, hi]) for lo, hi in sealed.unsealed),
                   (f"id IN (SELECT id FROM entries INDEXED BY span_unblocked WHERE {SPAN_UNBLOCKED} AND id <= ?)",
                    [sealed.high])]
        rows = {row[0]: row for clause in clauses for row in store.select(
            "span", ("id", "step", "name", "rank", "pid", "time"), ("duration_s",), order=None, clause=clause,
            by_id=True, **filters)}
        keep = np.ones(len(sealed.ids), dtype=bool)
        if ranks is not None:
            keep &= np.isin(sealed.ranks, np.array(_listed(ranks), dtype=np.int64))
        if step_min is not None:
            keep &= sealed.steps >= step_min
        if step_max is not None:
            keep &= sealed.steps <= step_max
        calls = np.array([_is_ray_call(name) for name in sealed.names] + [False], dtype=bool)
        keep &= ~calls[sealed.codes] & ~np.isin(sealed.ids, np.fromiter(rows, dtype=np.int64, count=len(rows)))
        loose = _loose_spans(rows.values())
        if loose is None:
            return None
        seconds = sealed.seconds[keep]
        block = (sealed.steps[keep], sealed.codes[keep], sealed.ranks[keep], sealed.ids[keep],
                 np.where(np.isfinite(seconds), seconds, 0.0))  # as _number reads them
        return _merged(store, block, sealed.names, *loose)


#: The straggler rule of the timeline and the report: the slowest rank of a step's phase took this many times the
#: median of the ranks (``raysleuth timeline --summary`` marks it, the report lists it).
STRAGGLER_RATIO = 1.5


def phases_from_totals(totals: Iterable[tuple[int, str, Any, float]]) -> list[StepPhase]:
    """:func:`summarize_steps` over (step, phase, rank, seconds) totals (pure)."""
    return _summarize_rows((step, phase, rank, None, seconds) for step, phase, rank, seconds in totals)


def stragglers_of(rows: Iterable[StepPhase], ratio: float = STRAGGLER_RATIO) -> list[StepPhase]:
    """The step phases whose slowest rank took at least ``ratio`` times the median of two or more ranks."""
    return [row for row in rows if len(row.durations) > 1 and row.lag_ratio >= ratio]


def _loose_spans(rows: Iterable[tuple]) -> tuple | None:
    """The spans read as rows ((id, step, name, rank, pid, time, duration)), as :func:`_summarize_rows` takes them
    (no step or a Ray call: left out; the phase ``str(name)``, the seconds as it adds them): columns of steps,
    phases, ranks (None: by pid), pids, times, ids and seconds; None where a step or rank is not an int."""
    kept: list[tuple] = []
    for id_, step, name, rank, pid, when, duration in rows:
        if step is None or _is_ray_call(name):
            continue
        if type(step) is not int or (rank is not None and type(rank) is not int) or type(when) not in (int, float):
            return None
        seconds = duration if type(duration) is float and duration - duration == 0 else _number(duration, 0.0)
        kept.append((step, str(name), rank, pid, float(when), id_, seconds))
    return tuple(list(column) for column in zip(*kept)) if kept else ((),) * 7


def _merged(store, block: tuple, names: list[str], steps, phases, ranks, pids, times, ids, seconds) -> dict | None:
    """The blocks' spans (``block``: steps, phase codes into ``names``, ranks, ids, seconds as columns) and the
    rows' (the columns of :func:`_loose_spans`) grouped as :func:`_summarize_rows` groups them: per (step, phase),
    seconds per rank in the order its rows would first name each."""
    import numpy as np

    code_of = {name: at for at, name in enumerate(names)}
    for phase in phases:
        code_of.setdefault(phase, len(code_of))
    by_pid: dict[str, int] = {}
    keys = [rank if rank is not None else by_pid.setdefault(f"pid {pid}", len(by_pid))
            for rank, pid in zip(ranks, pids)]
    b_steps, b_codes, b_ranks, b_ids, b_seconds = block
    try:
        step = np.concatenate((b_steps, np.array(steps, dtype=np.int64)))
        key = np.concatenate((b_ranks, np.array(keys, dtype=np.int64)))
    except OverflowError:  # an int past 64 bits
        return None
    code = np.concatenate((b_codes, np.array([code_of[p] for p in phases], dtype=np.int64)))
    ranked = np.concatenate((np.ones(len(b_ids), dtype=np.int8),
                             np.array([r is not None for r in ranks], dtype=np.int8)))
    ident = np.concatenate((b_ids, np.array(ids, dtype=np.int64)))
    value = np.concatenate((b_seconds, np.array(seconds, dtype=np.float64)))
    when = np.concatenate((np.full(len(b_ids), np.nan), np.array(times, dtype=np.float64)))
    order = np.lexsort((ident, key, ranked, code, step))  # a key's spans in id order (times below)
    step, code, ranked, key, ident, value, when = (a[order] for a in (step, code, ranked, key, ident, value, when))
    starts = np.flatnonzero(np.concatenate(([True], (np.diff(step) != 0) | (np.diff(code) != 0)
                                            | (np.diff(ranked) != 0) | (np.diff(key) != 0)))) if len(order) \
        else np.empty(0, dtype=np.int64)
    counts = np.diff(np.append(starts, len(order)))
    totals = (value[starts] + 0.0).tolist()  # 0.0 + seconds, as the rows' first add (-0.0 becomes 0.0)
    firsts: dict[int, tuple] = {}  # a rank-less worker's group: its first (time, id), which orders it
    repeated = np.flatnonzero((counts > 1) | (ranked[starts] == 0)).tolist()
    if repeated:
        missing = [int(ident[at]) for group in repeated
                   for at in range(starts[group], starts[group] + counts[group]) if when[at] != when[at]]
        known = dict(_times(store, missing))
        for group in repeated:
            members = sorted((known.get(int(ident[at]), float(when[at])), int(ident[at]), float(value[at]))
                             for at in range(starts[group], starts[group] + counts[group]))
            total = 0.0
            for _, _, seconds_ in members:
                total += seconds_
            totals[group] = total
            firsts[group] = members[0][:2]
    return _cells(step[starts], code[starts], ranked[starts], key[starts], totals, firsts, code_of, by_pid)


def _cells(steps, codes, ranked, keys, totals: list, firsts: dict, code_of: dict, by_pid: dict) -> dict:
    """:func:`_merged`'s groups (one per step, phase and rank or worker, in that order) as the dicts of
    :func:`_summarize_rows`: per (step, phase), each rank's seconds, the rank-less workers first."""
    import numpy as np

    names = list(code_of)
    pid_names = list(by_pid)
    if len(keys) and 0 <= int(keys.min()) and int(keys.max()) < 4 * len(keys):  # ranks: a table of their names
        as_rank = np.array([str(rank) for rank in range(int(keys.max()) + 1)], dtype=object)[keys]
    else:
        unique, inverse = np.unique(keys, return_inverse=True)
        as_rank = np.array([str(rank) for rank in unique.tolist()], dtype=object)[inverse.reshape(-1)]
    every_ranked = bool(ranked.all())
    whos = as_rank.tolist() if every_ranked else \
        [as_rank[at] if ranked[at] else pid_names[keys[at]] for at in range(len(keys))]
    cuts = np.flatnonzero(np.concatenate(([True], (np.diff(steps) != 0) | (np.diff(codes) != 0)))).tolist() \
        if len(steps) else []
    grouped: dict[tuple[int, str], dict[str, float]] = {}
    step_list, code_list = steps.tolist(), codes.tolist()
    ranked_list = [] if every_ranked else ranked.tolist()
    for start, end in zip(cuts, cuts[1:] + [len(steps)]):
        members = range(start, end)
        unranked = [] if every_ranked else [at for at in members if not ranked_list[at]]
        if unranked:  # the rank-less first (SQLite's NULLs first), in the order their first spans were read
            unranked.sort(key=firsts.__getitem__)
            members = unranked + [at for at in members if ranked_list[at]]  # type: ignore[assignment]
            grouped[(step_list[start], names[code_list[start]])] = {whos[at]: totals[at] for at in members}
        else:
            grouped[(step_list[start], names[code_list[start]])] = dict(zip(whos[start:end], totals[start:end]))
    return grouped


def _times(store, ids: list[int]) -> Iterable[tuple[int, float]]:
    """(id, time) of these spans (the blocks hold no times: a repeated key's spans are summed in time order)."""
    for start in range(0, len(ids), 5000):
        some = ids[start:start + 5000]
        yield from ((id_, float(when)) for id_, when in store._db.execute(
            f"SELECT id, time FROM entries WHERE id IN ({','.join('?' * len(some))})", some))
