"""A block's int64 columns as their first values and the steps between them, each in the fewest bytes that hold
every step (schema 9's memory and span blocks, schema 10's memory block of every sender in a pass:
:mod:`raysleuth.recorder.blocks`, ``span_blocks``).

A worker's samples change little from one to the next: a sample a second is 2**22 steps of a time's bits, a few
thousand ids, the same rank, a few pages of memory. So a column of 3,600 int64 (28.8 KB) is mostly 1, 2 or 4
bytes a step, and a block of nine such columns under 75 KB instead of 259 KB, with no compression to undo: reading
a full-mode block takes about 0.15 ms instead of zlib's 0.37 (a thousand of them in every ``raysleuth memory``).

Layout: the byte :data:`MARK`, each column's step width (one byte: 1, 2, 4 or 8; 0 when every step is zero: one
value, no steps stored), each column's shift (one byte: the zero bits all its steps end with, dropped: memory
moves by whole 4 KiB pages), each column's first value (int64), then each column's n - 1 steps, shifted, as
signed ints of its width; native byte order, as the blocks before. Steps wrap as int64 arithmetic does (numpy's
``diff`` and ``cumsum`` both wrap), so every value comes back to the bit, whatever its range; a float column goes
in as its bits (``view``). A body that begins with :data:`BREAKS` (schema 10's block of every sender in a pass)
holds, after the first values, how many breaks (int64), their places (int64 each) and each column's steps at them
(int64 each, column by column); among the other steps, theirs are zero.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BREAKS", "MARK", "ZLIB", "decode", "encode", "run_starts"]

#: The first byte of a body in this layout (a zlib stream, the layout before, begins with :data:`ZLIB`).
MARK = 1
#: How a block written before schema 9 begins: a zlib stream (its times or seconds, then its int64 columns).
ZLIB = b"\x78"
#: The first byte of a body with breaks: places where a new run of rows begins (schema 10's block of every sender
#: in a pass: a sender's first sample after another's), whose steps are kept whole, apart, so that one jump from a
#: worker's memory to the next one's does not widen every step of the column (nor a null to a number).
BREAKS = 2
_WIDTHS = (1, 2, 4, 8)  # and 0: a column whose steps are all zero (one value) holds no step


def encode(columns: Any, breaks: Any = None) -> bytes:
    """The body of a (k, n) int64 array (or k int64 rows of n: no (k, n) copy is made of them): its k columns,
    first values and steps. ``breaks``: the places (1 to n - 1, ascending) where a run begins; their steps are kept
    whole (after the first values: how many, where, each column's), the rest as before."""
    import numpy as np

    rows = [np.asarray(row, dtype=np.int64) for row in columns]
    k, n = len(rows), (len(rows[0]) if rows else 0)
    places = None if breaks is None else np.asarray(breaks, dtype=np.int64)
    widths, shifts, parts, kept = [], [], [], []
    for values in rows:
        row = np.diff(values)  # one column's steps at a time: no (k, n - 1) array of them
        if places is not None:
            kept.append(row[places - 1].tobytes())
            row[places - 1] = 0
        common = int(np.bitwise_or.reduce(row)) if n > 1 else 0
        shift = (common & -common).bit_length() - 1 if common else 0  # the zero bits every step ends with
        if shift:
            row >>= shift  # exact: those bits are zero (an arithmetic shift keeps the sign)
        low, high = (int(row.min()), int(row.max())) if n > 1 else (0, 0)
        width = 0 if low == high == 0 else next(w for w in _WIDTHS if -(1 << (8 * w - 1)) <= low
                                                and high < (1 << (8 * w - 1)))
        widths.append(width)
        shifts.append(shift)
        parts.append(row.astype(f"i{width}").tobytes() if width else b"")
    firsts = np.array([values[0] for values in rows] if n else [0] * k, dtype=np.int64)
    head = b"" if places is None else np.int64(len(places)).tobytes() + places.tobytes()
    mark = MARK if breaks is None else BREAKS
    return bytes([mark, *widths, *shifts]) + firsts.tobytes() + head + b"".join(kept) + b"".join(parts)


def _layout(body: bytes, k: int, n: int) -> tuple:
    """(widths, shifts, the breaks' places and each column's steps there (None, None: no breaks), where each
    column's steps begin) of a body, checked against its length."""
    import numpy as np

    if not body or body[0] not in (MARK, BREAKS):
        raise ValueError("not a block of first values and steps")
    widths, shifts = body[1:1 + k], body[1 + k:1 + 2 * k]
    at = 1 + 10 * k
    places, kept = None, None
    if body[0] == BREAKS:
        count = int(np.frombuffer(body, dtype=np.int64, count=1, offset=at)[0]) if len(body) >= at + 8 else -1
        if not 0 <= count < max(n, 1) or len(body) < at + 8 * (1 + count + k * count):
            raise ValueError(f"a block of {len(body)} bytes cannot hold its breaks")
        places = np.frombuffer(body, dtype=np.int64, count=count, offset=at + 8)
        kept = np.frombuffer(body, dtype=np.int64, count=k * count, offset=at + 8 + 8 * count).reshape(k, count)
        at += 8 * (1 + count + k * count)
    starts = [at]
    for width in widths:
        starts.append(starts[-1] + width * max(n - 1, 0))
    if starts[-1] != len(body):
        raise ValueError(f"a block of {len(body)} bytes holds {starts[-1]}")
    return widths, shifts, places, kept, starts


def run_starts(body: bytes, k: int, n: int, rows: tuple[int, ...]) -> tuple | None:
    """Of a body with breaks whose ``rows`` change at its breaks only (no other step: a pass's sender and source):
    (each run's first place, from 0, as int64; the ``rows``' values there, a (len(rows), runs) array), read off the
    breaks without a column decoded; None where it cannot say (no breaks, no rows, a row with other steps, places
    not rising within the block): :func:`decode` those rows then."""
    import numpy as np

    widths, _, places, kept, _ = _layout(body, k, n)
    if places is None or not n or any(widths[row] for row in rows):
        return None
    at = np.concatenate(([0], places))
    if len(places) and not (bool((np.diff(at) > 0).all()) and int(at[-1]) < n):
        return None
    firsts = np.frombuffer(body, dtype=np.int64, count=k, offset=1 + 2 * k)
    values = np.empty((len(rows), len(at)), dtype=np.int64)
    for place, row in enumerate(rows):
        values[place, 0] = firsts[row]
        values[place, 1:] = kept[row]
    return at, np.cumsum(values, axis=1, out=values)  # wraps as decode's sums do


def decode(body: bytes, k: int, n: int, rows: tuple[int, ...] | None = None, into: Any = None) -> Any:
    """The (k, n) int64 array of a body :func:`encode` wrote (a new array, writable); ``rows``: only these columns,
    in this order (a (len(rows), n) array); ``into``: an int64 array of at least that many rows and columns, whose
    first ones it fills and gives (a reader of many blocks reuses one: no new memory to fault in for each)."""
    import numpy as np

    widths, shifts, places, kept, starts = _layout(body, k, n)
    wanted = range(k) if rows is None else rows
    out = np.empty((len(wanted), n), dtype=np.int64) if into is None else into[:len(wanted), :n]
    if not n:
        return out
    firsts = np.frombuffer(body, dtype=np.int64, count=k, offset=1 + 2 * k)
    run = None  # the first place of the run of columns with steps being filled: each run summed at once
    for place, row in enumerate(wanted):
        if not widths[row] and (kept is None or not kept[row].any()):  # every value the first: nothing to sum
            out[place] = firsts[row]
            if run is not None:
                np.cumsum(out[run:place], axis=1, out=out[run:place])
                run = None
            continue
        out[place, 0] = firsts[row]
        if widths[row]:
            out[place, 1:] = np.frombuffer(body, dtype=f"i{widths[row]}", count=n - 1, offset=starts[row])
            if shifts[row]:
                out[place, 1:] <<= shifts[row]
        else:
            out[place, 1:] = 0
        if kept is not None:
            out[place, places] = kept[row]  # a break's step, whole (place p's step sits at p in the row)
        run = place if run is None else run
    if run is not None:
        np.cumsum(out[run:], axis=1, out=out[run:])
    return out
