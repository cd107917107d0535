"""A block's int64 columns as their first values and the steps between them, each in the fewest bytes that hold
every step (schema 9's memory and span blocks: :mod:`raysleuth.recorder.blocks`, ``span_blocks``).

A worker's samples change little from one to the next: a sample a second is 2**22 steps of a time's bits, a few
thousand ids, the same rank, a few pages of memory. So a column of 3,600 int64 (28.8 KB) is mostly 1, 2 or 4
bytes a step, and a block of nine such columns under 75 KB instead of 259 KB, with no compression to undo: reading
a full-mode block takes about 0.15 ms instead of zlib's 0.37 (a thousand of them in every ``raysleuth memory``).

Layout: the byte :data:`MARK`, each column's step width (one byte: 1, 2, 4 or 8; 0 when every step is zero: one
value, no steps stored), each column's shift (one byte: the zero bits all its steps end with, dropped: memory
moves by whole 4 KiB pages), each column's first value (int64), then each column's n - 1 steps, shifted, as
signed ints of its width; native byte order, as the blocks before. Steps wrap as int64 arithmetic does (numpy's
``diff`` and ``cumsum`` both wrap), so every value comes back to the bit, whatever its range; a float column goes
in as its bits (``view``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MARK", "decode", "encode"]

#: The first byte of a body in this layout (a zlib stream, the layout before, begins with 0x78).
MARK = 1
_WIDTHS = (1, 2, 4, 8)  # and 0: a column whose steps are all zero (one value) holds no step


def encode(columns: Any) -> bytes:
    """The body of a (k, n) int64 array: its k columns, first values and steps."""
    import numpy as np

    columns = np.ascontiguousarray(columns, dtype=np.int64)
    k, n = columns.shape
    steps = np.diff(columns, axis=1)
    widths, shifts, parts = [], [], []
    for row in steps:
        common = int(np.bitwise_or.reduce(row)) if n > 1 else 0
        shift = (common & -common).bit_length() - 1 if common else 0  # the zero bits every step ends with
        if shift:
            row = row >> shift  # exact: those bits are zero (an arithmetic shift keeps the sign)
        low, high = (int(row.min()), int(row.max())) if n > 1 else (0, 0)
        width = 0 if low == high == 0 else next(w for w in _WIDTHS if -(1 << (8 * w - 1)) <= low
                                                and high < (1 << (8 * w - 1)))
        widths.append(width)
        shifts.append(shift)
        parts.append(row.astype(f"i{width}").tobytes() if width else b"")
    firsts = columns[:, 0] if n else np.zeros(k, dtype=np.int64)
    return bytes([MARK, *widths, *shifts]) + firsts.tobytes() + b"".join(parts)


def decode(body: bytes, k: int, n: int, rows: tuple[int, ...] | None = None) -> Any:
    """The (k, n) int64 array of a body :func:`encode` wrote (a new array, writable); ``rows``: only these columns,
    in this order (a (len(rows), n) array)."""
    import numpy as np

    if not body or body[0] != MARK:
        raise ValueError("not a block of first values and steps")
    widths, shifts = body[1:1 + k], body[1 + k:1 + 2 * k]
    starts = [1 + 10 * k]
    for width in widths:
        starts.append(starts[-1] + width * max(n - 1, 0))
    if starts[-1] != len(body):
        raise ValueError(f"a block of {len(body)} bytes holds {starts[-1]}")
    wanted = range(k) if rows is None else rows
    out = np.empty((len(wanted), n), dtype=np.int64)
    if not n:
        return out
    firsts = np.frombuffer(body, dtype=np.int64, count=k, offset=1 + 2 * k)
    for place, row in enumerate(wanted):
        out[place, 0] = firsts[row]
        if not widths[row]:  # every value the first
            out[place, 1:] = 0
            continue
        out[place, 1:] = np.frombuffer(body, dtype=f"i{widths[row]}", count=n - 1, offset=starts[row])
        if shifts[row]:
            out[place, 1:] <<= shifts[row]
    np.cumsum(out, axis=1, out=out)
    return out
