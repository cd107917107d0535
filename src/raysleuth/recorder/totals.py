"""Span totals per step, rank and phase (the report's step section): summed in SQL, or in numpy from the spans.

Top-level spans (no parent) with a numeric duration count. :func:`span_totals` is SQL's ``GROUP BY``;
:func:`span_columns` the same totals as numpy columns, from the span blocks of the writer's passes
(:mod:`raysleuth.recorder.span_blocks`) and the spans no block holds, handed over unsorted (SQLite's sort of
299,000 spans for a 1,000-rank hour was most of the time, then handing them over).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from raysleuth.recorder import blocks, span_blocks
from raysleuth.recorder.reading import _by_id, _field_sql, _listed, _packs, _rows, table_for, where_clause
from raysleuth.recorder.schema import COPIED, COPY_MARK, VALUE_COLUMNS

__all__ = ["span_columns", "span_rows", "span_totals", "totals_arrays"]


def span_totals(store, *, job: Iterable[str] | None = None) -> Iterator[tuple]:
    """(step, rank, phase, seconds) per step, rank and phase, in that order: top-level spans (no parent) with a
    numeric duration."""
    if store.schema_version < 2 and job is not None:
        return
    source, duration, args = _top_level(store, job)
    sql = (f"SELECT step, rank, {_PHASE}, SUM({duration}) {source} GROUP BY step, rank, {_PHASE}"
           f" HAVING SUM({duration}) IS NOT NULL"  # SUM skips NULLs
           f" ORDER BY step, rank, {_PHASE}")  # the GROUP BY's own order: no second sort
    yield from _rows(store, sql, args)


#: A span's phase as the totals name it.
_PHASE = "COALESCE(name, phase, '?')"


def _top_level(store, job: Iterable[str] | None, by_id: bool = False) -> tuple[str, str, list]:
    """(``FROM ... WHERE ...`` of the top-level spans with a step and a rank, the SQL of their duration: valid
    JSON, a number, or its kept copy, and the arguments) that both readers of the totals select from."""
    spans, args = _spans(store, job, by_id)
    packed, flag = _packs(store), _flag(store, job)
    duration = _field_sql("duration_s:number", True, packed, flag)
    parent = _field_sql("parent_id", True, packed, flag)
    return f"{spans} AND IFNULL({parent}, 0) IN (0, '')", duration, args


def _spans(store, job: Iterable[str] | None, by_id: bool = False) -> tuple[str, list]:
    """(``FROM ... WHERE ...`` of the spans with a step and a rank, its arguments): what the totals read. ``by_id``:
    the kind's index left alone (a clause of ids picks the rows: SQLite would walk every span of the run)."""
    where, args = where_clause(kind="span", job=job)
    where = [_by_id(term) for term in where] if by_id else where
    return f"FROM {table_for(store, job)} WHERE {' AND '.join(where)} AND step IS NOT NULL AND rank IS NOT NULL", args


def _top_level_rows(store, job: Iterable[str] | None, clause: tuple[str, list] = ("1", [])) -> list[tuple]:
    """(id, step, rank, phase, seconds, ...) of every top-level span with a numeric duration, as :func:`_top_level`
    finds them (among the rows ``clause``, an SQL condition and its arguments, admits), in one pass over the
    spans: those whose fields the writer kept in value columns (``schema.COPIED``, marked) read there, with none
    of the CASEs to evaluate (0.4 s instead of 0.8 for a 1,000-rank hour's 299,000); the others (no mark:
    written by an older raysleuth or through the view) found in the same pass and read from their JSON by id."""
    by_id = clause[0] != "1"
    source, duration, args = _top_level(store, job, by_id)
    where, more = f" AND ({clause[0]})", list(clause[1])
    if not _packs(store):
        return list(_rows(store, f"SELECT id, step, rank, {_PHASE}, {duration} {source} AND {duration} IS NOT NULL"
                                 f"{where}", [*args, *more]))
    # the tests _top_level's CASEs make of a row with the mark, never NULL (IS; data = '' is never NULL)
    copied = f"(NOT ({_flag(store, job)}) AND {VALUE_COLUMNS[-1]} IS {COPY_MARK})"
    spans, spans_args = _spans(store, job, by_id)
    duration_at, parent_at = (VALUE_COLUMNS[COPIED["span"].index(field)] for field in ("duration_s", "parent_id"))
    rows = list(_rows(store, f"SELECT id, step, rank, {_PHASE}, {duration_at}, {copied} {spans} AND (NOT {copied} OR"
                             f" (IFNULL({parent_at}, 0) IN (0, '') AND typeof({duration_at}) IN ('integer', 'real')))"
                             f"{where}", [*spans_args, *more]))
    unmarked = [row[0] for row in rows if not row[5]]
    if unmarked:
        rows = [row for row in rows if row[5]]
        for start in range(0, len(unmarked), 5000):
            some = unmarked[start:start + 5000]
            rows.extend(_rows(store, f"SELECT id, step, rank, {_PHASE}, {duration} {source} AND {duration} IS NOT NULL"
                                     f" AND id IN ({','.join('?' * len(some))})", [*args, *some]))
    return rows


def _flag(store, job: Iterable[str] | None) -> str:
    """The SQL that says a row's data is packed into value columns, in the table :func:`table_for` reads."""
    return "data = ''" if table_for(store, job) == "entries" else "packed"


def span_columns(store, *, job: Iterable[str] | None = None) -> tuple | None:
    """:func:`span_totals` as numpy columns: (steps, ranks, phase codes, phase names, seconds), one entry per step,
    rank and phase in that order, the codes indexing the sorted names. SQLite's GROUP BY sorts every span to
    sum them (0.8 s for a 1,000-rank hour's 299,000); here the spans the writer's passes sealed come from their
    blocks as columns (0.04 s for the same hour), the rest unsorted from SQLite, and numpy sorts and cuts them
    all. A key held by one span is that span's duration; repeated keys are summed as SQLite's ``SUM``
    does, in the order the spans were written: whole numbers exactly, otherwise a float added left to right.
    None where these columns cannot say it (a step, rank or name of another type, an int past 64 bits, a
    duration that is not finite): :func:`span_totals` then."""
    import numpy as np

    if store.schema_version < 2 and job is not None:
        return _no_spans(np)
    jobs = None if job is None else _listed(job)
    with blocks.snapshot(store):  # the passes' blocks and the rows they leave, of one state of the file
        sealed = span_blocks.read(store, jobs)
        rows = [row for clause in (sealed.clauses if sealed else [("1", [])])
                for row in _top_level_rows(store, jobs, clause)]
    if not rows and not (sealed and len(sealed.ids)):
        return _no_spans(np)
    ids, steps, ranks, names, read = list(zip(*rows))[:5] if rows else ((), (), (), (), ())
    seconds: Sequence[Any] | _Seconds = read
    del rows
    arrays = totals_arrays(steps, ranks, names, read) if ids else _no_spans(np)
    if arrays is None:
        return None
    step_of, rank_of, phase_of, ordered, values = arrays
    id_of = np.array(ids, dtype=np.int64)
    if sealed is not None and len(sealed.ids):  # the blocks' spans first (a repeated key's: floats, see below)
        ordered, (held, loose) = _merged_names(sealed.names, ordered)
        step_of, rank_of = np.concatenate((sealed.steps, step_of)), np.concatenate((sealed.ranks, rank_of))
        phase_of = np.concatenate((held[sealed.codes], loose[phase_of]))
        values, id_of = np.concatenate((sealed.seconds, values)), np.concatenate((sealed.ids, id_of))
        seconds = _Seconds(sealed.seconds, read)
    order = _key_order(step_of, rank_of, phase_of, id_of, len(ordered))  # a key's spans in id order
    step_of, rank_of, phase_of = step_of[order], rank_of[order], phase_of[order]
    first = np.flatnonzero(np.concatenate(([True], (np.diff(step_of) != 0) | (np.diff(rank_of) != 0)
                                           | (np.diff(phase_of) != 0))))
    counts = np.diff(np.append(first, len(order)))
    totals = values[order[first]]
    for group in np.flatnonzero(counts > 1).tolist():  # repeated keys (a phase entered twice in a step): few
        taken = [seconds[at] for at in order[first[group]:first[group] + counts[group]].tolist()]
        if all(type(value) is int for value in taken):
            totals[group] = float(sum(taken))
        else:
            total = 0.0
            for value in taken:
                total += value
            totals[group] = total
    if not np.isfinite(totals).all():
        return None
    return step_of[first], rank_of[first], phase_of[first], ordered, totals


def _key_order(step_of, rank_of, phase_of, id_of, phases: int):
    """``np.lexsort((id_of, phase_of, rank_of, step_of))``: where the ids rise as given and (step, rank, phase) fit
    one int64, a stable sort of that one key (a third of the four keys' time), else the four."""
    import numpy as np

    if len(id_of) > 1 and bool((np.diff(id_of) > 0).all()):
        low_step, low_rank = int(step_of.min()), int(rank_of.min())
        steps, ranks = int(step_of.max()) - low_step + 1, int(rank_of.max()) - low_rank + 1
        if steps * ranks * max(phases, 1) < 2**62:
            return np.argsort(((step_of - low_step) * ranks + (rank_of - low_rank)) * phases + phase_of, kind="stable")
    return np.lexsort((id_of, phase_of, rank_of, step_of))


def _merged_names(first: list[str], second: list[str]) -> tuple[list[str], tuple]:
    """(the sorted union of two name lists, each list's codes into it as an int64 array)."""
    import numpy as np

    ordered = sorted(set(first) | set(second))
    at = {name: number for number, name in enumerate(ordered)}
    return ordered, tuple(np.array([at[name] for name in names], dtype=np.int64) for names in (first, second))


class _Seconds:
    """The durations as the readers hold them: a block's as floats (``SPAN_SEALED`` admits no integer a float
    would not sum exactly), then the rows' as they were read."""

    def __init__(self, sealed, rows: Sequence[Any]) -> None:
        self.sealed, self.rows, self.cut = sealed, rows, len(sealed)

    def __getitem__(self, at: int) -> Any:
        return float(self.sealed[at]) if at < self.cut else self.rows[at - self.cut]


def totals_arrays(steps: Sequence[Any], ranks: Sequence[Any], names: Sequence[Any],
                  seconds: Sequence[Any]) -> tuple | None:
    """(steps, ranks, phase codes as int64, the sorted phase names, seconds as float64) of span totals' columns;
    None unless every step and rank is an int within 64 bits, every name a str and every duration a finite
    int or float (what numpy's columns cannot hold exactly is left to the rows' readers)."""
    import numpy as np

    if (set(map(type, steps)) != {int} or set(map(type, ranks)) != {int} or set(map(type, names)) != {str}
            or not set(map(type, seconds)) <= {int, float}):
        return None
    ordered = sorted(set(names))
    code = {name: number for number, name in enumerate(ordered)}
    try:
        step_of, rank_of = np.array(steps, dtype=np.int64), np.array(ranks, dtype=np.int64)
        values = np.array(seconds, dtype=np.float64)
    except OverflowError:  # an int past 64 bits
        return None
    if not np.isfinite(values).all():
        return None
    return (step_of, rank_of, np.fromiter(map(code.__getitem__, names), dtype=np.int64, count=len(names)), ordered,
            values)


def span_rows(columns: tuple) -> list[tuple]:
    """:func:`span_columns`' arrays as :func:`span_totals`' (step, rank, phase, seconds) tuples."""
    steps, ranks, codes, names, seconds = columns
    return list(zip(steps.tolist(), ranks.tolist(), [names[code] for code in codes.tolist()], seconds.tolist()))


def _no_spans(np) -> tuple:
    return (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), [],
            np.empty(0, dtype=np.float64))
