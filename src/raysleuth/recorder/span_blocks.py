"""Top-level spans also kept as columns, one block a pass (schema 7), for the report's step totals.

A thousand ranks stepping every 12 s write 299,000 top-level spans an hour; SQLite hands each to Python as a
tuple at about 2 µs, and summing them per step, rank and phase took most of the report's step section. So each
pass of :mod:`raysleuth.recorder.blocks` (the writer's, over ids ``(lo, hi]``) also reads the spans that
:data:`~raysleuth.recorder.schema.SPAN_SEALED` admits and writes one block: the top-level ones with a numeric
duration (those :func:`raysleuth.recorder.totals.span_columns` sums) as columns (seconds, id, sender, step, rank,
phase code: first values and steps, :mod:`~raysleuth.recorder.deltas`; zlib before schema 9) and the sorted phase
names. The rows stay as they are.

A reader (:func:`read`) takes, in one snapshot, every pass's block, then row by row only what no block holds:
the spans above the newest pass's top, those at or below it that ``SPAN_SEALED`` leaves out (through migration
7's ``span_loose`` index), and every span of a pass made before schema 7 (its block says ``n = -1``). A span
written, changed or removed at or below a pass's top drops that pass and every later one, with their blocks.
"""

from __future__ import annotations

import json
import zlib
from typing import Any, NamedTuple

from raysleuth.recorder import deltas
from raysleuth.recorder.schema import SPAN_SEALED

__all__ = ["SPAN_SEALED", "Sealed", "read", "seal"]

#: The spans with a step and a rank at or below a pass's top that no block holds (spelled as ``span_loose``).
_LOOSE_IDS = ("SELECT id FROM entries INDEXED BY span_loose WHERE kind = 'span' AND step IS NOT NULL AND "
              f"rank IS NOT NULL AND NOT ({SPAN_SEALED})")
#: The spans of a pass that its block holds, in id order: top-level (no parent) with a numeric duration, of those
#: ``SPAN_SEALED`` admits, read off the ``span_loose`` index (the few ids of the pass there, not the test on
#: every span, as :mod:`~raysleuth.recorder.blocks` reads ``SEALED``).
_SEAL = ("SELECT id, sender, step, rank, coalesce(name, phase, '?'), v0 FROM entries NOT INDEXED "
         "WHERE id > ? AND id <= ? AND kind = 'span' AND step IS NOT NULL AND rank IS NOT NULL AND IFNULL(v1, 0) "
         f"IN (0, '') AND typeof(v0) IN ('integer', 'real') AND id NOT IN ({_LOOSE_IDS} AND id > ? AND id <= ?)")
#: The integer columns of a block, in order, after its seconds.
INTS = ("id", "sender", "step", "rank", "code")
#: The clause of those spans a reader reads row by row.
_LOOSE = f"id IN ({_LOOSE_IDS} AND id <= ?)"


def seal(db, low: int, high: int) -> int:
    """The block of the pass ``(low, high]`` (inside that pass's transaction): the spans it holds."""
    import numpy as np

    rows = db.execute(_SEAL, (low, high, low, high)).fetchall()
    names = sorted({row[4] for row in rows})
    code = {name: number for number, name in enumerate(names)}
    columns: list[Any] = list(zip(*rows)) if rows else [()] * 6
    body = deltas.encode(np.vstack((np.array(columns[5], dtype=np.float64).view(np.int64).reshape(1, -1),
                                    np.array(columns[:4], dtype=np.int64).reshape(4, -1),
                                    np.fromiter(map(code.__getitem__, columns[4]), dtype=np.int64,
                                                count=len(rows)).reshape(1, -1))))
    db.execute("INSERT OR REPLACE INTO span_blocks (pass, n, names, body) VALUES (?, ?, ?, ?)",
               (high, len(rows), json.dumps(names), body))
    return len(rows)


class Sealed(NamedTuple):
    """What the blocks up to a pass's top hold (numpy columns, concatenated in pass order; the codes index
    ``names``, in the order the blocks first name them), and the SQL conditions (with their arguments) of the
    spans a reader still reads row by row."""

    ids: Any
    steps: Any
    ranks: Any
    codes: Any
    names: list[str]
    seconds: Any
    clauses: list[tuple[str, list]]
    high: int = 0
    """The newest pass's top: the blocks hold spans at or below it."""
    unsealed: tuple = ()
    """(lo, hi] of the passes whose spans no block holds (runs of them merged)."""


def read(store, job: list[str] | None = None) -> Sealed | None:
    """Every span block of the newest pass and those before it (``job``: only the senders of these Ray jobs), and
    where the rest lies; None where no pass holds spans (a file before schema 7, or no pass yet): every span is
    read row by row. Call it inside :func:`raysleuth.recorder.blocks.snapshot`, with the rows it leaves."""
    import numpy as np

    if store.schema_version < 7:
        return None
    passes = store._db.execute("SELECT p.hi, p.lo, b.n, b.names, b.body FROM block_passes p LEFT JOIN span_blocks b "
                               "ON b.pass = p.hi ORDER BY p.hi").fetchall()
    if not passes:
        return None
    high = passes[-1][0]
    allowed = None
    if job is not None:
        allowed = np.array([row[0] for row in store._db.execute(
            f"SELECT id FROM senders WHERE job_id IN ({','.join('?' * len(job))})", job)], dtype=np.int64)
    names: dict[str, int] = {}
    parts: list[tuple] = []
    unsealed: list[list[int]] = []  # (lo, hi] of the passes whose spans no block holds, runs of them merged
    for hi, lo, n, named, body in passes:
        if n is None or n < 0:
            if unsealed and unsealed[-1][1] == lo:
                unsealed[-1][1] = hi
            else:
                unsealed.append([lo, hi])
            continue
        if not n:
            continue
        if body[:1] == deltas.ZLIB:  # a block written before schema 9
            raw = zlib.decompress(body)
            seconds = np.frombuffer(raw, dtype=np.float64, count=n)
            ints = np.frombuffer(raw, dtype=np.int64, offset=8 * n).reshape(len(INTS), n)
        else:
            columns = deltas.decode(body, 1 + len(INTS), n)
            seconds, ints = columns[0].view(np.float64), columns[1:]
        own = np.array([names.setdefault(name, len(names)) for name in json.loads(named)], dtype=np.int64)
        keep = slice(None) if allowed is None else np.isin(ints[1], allowed)
        parts.append((ints[0][keep], ints[2][keep], ints[3][keep], own[ints[4][keep]], seconds[keep]))
    ranges = [("id > ? AND id <= ?", [lo, hi]) for lo, hi in unsealed]
    outside = "".join(f" AND NOT (id > {int(lo)} AND id <= {int(hi)})" for lo, hi in unsealed)
    clauses = [("id > ?", [high]), *ranges, (_LOOSE + outside, [high])]
    where = (high, tuple((lo, hi) for lo, hi in unsealed))
    if not parts:
        empty = np.empty(0, dtype=np.int64)
        return Sealed(empty, empty, empty, empty, list(names), np.empty(0, dtype=np.float64), clauses, *where)
    ids, steps, ranks, codes, seconds = (np.concatenate(column) for column in zip(*parts))
    return Sealed(ids, steps, ranks, codes, list(names), seconds, clauses, *where)
