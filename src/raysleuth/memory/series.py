"""One worker's memory samples as float columns (the reader of :mod:`.workers` keeps no records), and a series
thinned for a chart (:func:`sparkline`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raysleuth.recorder.blocks import NULL

#: The sample fields a worker's summary reads.
METRICS = ("rss_bytes", "uss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes", "cuda_peak_bytes")

_PLAIN = {int, float, type(None)}
_STEPS = {int, type(None)}


def _floats(values: Sequence[Any]):
    """A column as float64 (None and anything not a number: NaN)."""
    import numpy as np

    if set(map(type, values)) <= _PLAIN:
        return np.array(values, dtype=float)
    return np.array([float(v) if _is_number(v) else _NAN for v in values], dtype=float)


class _Series:
    """One worker's samples of one source, as float columns in chunks (NaN where a sample has no number).

    Rows may come out of time order (read rank by rank, a worker whose rank became known later has
    rows under two ranks): :meth:`ordered` puts them in (time, id) order, as a time-ordered read.
    """

    __slots__ = ("chunks", "rank", "last", "identity", "inexact", "_newest", "_rank_at", "_in_order", "_unchecked")

    def __init__(self) -> None:
        self.chunks: list[tuple] = []
        self.rank: int | None = None
        self.last: tuple = ()
        self.identity: tuple = (None, None, None)
        """``_IDENTITY`` of the newest row (filled in after the read)."""
        self._newest = self._rank_at = (float("-inf"), -1)
        self._in_order, self._unchecked = True, False
        self.inexact = False
        """Whether ``last``'s numbers came from floats past 2**53 (:meth:`add_block`): :func:`exact_last` then."""

    def add(self, rows: Sequence[tuple]) -> None:
        """Rows of ``_COLUMNS + _FIELDS``, in (rank, time, id) order."""
        import numpy as np

        columns = list(zip(*rows))
        times, ids = _floats(columns[0]), np.array(columns[1], dtype=np.int64)
        first, newest = (float(times[0]), int(ids[0])), (float(times[-1]), int(ids[-1]))
        if first < self._newest:
            self._in_order = False
        if newest > self._newest:
            self._newest, self.last, self.inexact = newest, rows[-1], False
        ranked = [k for k in range(len(rows)) if rows[k][2] is not None]
        if ranked and (float(times[ranked[-1]]), int(ids[ranked[-1]])) >= self._rank_at:
            self.rank, self._rank_at = rows[ranked[-1]][2], (float(times[ranked[-1]]), int(ids[ranked[-1]]))
        steps: Any = columns[3]
        if not set(map(type, steps)) <= _STEPS:  # SQLite gives ints and None: anything else reads as no step
            steps = [s if isinstance(s, int) and not isinstance(s, bool) else None for s in steps]
        self.chunks.append((times, ids, _floats(steps), *(_floats(c) for c in columns[9:])))

    def add_block(self, times, ints, key_row: tuple, numbers, stepped: bool = True) -> None:
        """Samples of one sender and source from the blocks (:func:`raysleuth.recorder.blocks.read`: times, then
        ids, ranks and steps as int64 with :data:`~raysleuth.recorder.blocks.NULL`, and ``numbers``: the steps and
        the five numbers as float64, NaN for null), read as :meth:`add` reads their rows. ``key_row``: the row's
        identity places (``_COLUMNS + _FIELDS`` up to the numbers). ``stepped=False``: no steps in ``ints`` and
        ``numbers`` (a reader that shows none: every step reads as None). The columns are kept as given (views of
        the reader's arrays, not copies). The newest sample's numbers are its floats' (exact up to 2**53; past
        that, ``inexact``: its row's own are read then)."""
        import numpy as np

        ids, ranks = ints[0], ints[1]
        if not stepped:
            numbers = (None, *numbers)  # no steps (made NaN only where rows with steps join them)
        self._unchecked = True  # a block is in id order; a clock that went back is found in :meth:`ordered`
        if (float(times[0]), int(ids[0])) < self._newest:
            self._in_order = False
        k = _last(times, ids)
        if (float(times[k]), int(ids[k])) > self._newest:
            self._newest = (float(times[k]), int(ids[k]))
            step = None if not stepped or ints[2, k] == NULL else int(ints[2, k])
            values = [float(column[k]) for column in numbers[1:]]
            self.inexact = any(abs(value) >= 2.0**53 for value in values)
            self.last = (float(times[k]), int(ids[k]), None if ranks[k] == NULL else int(ranks[k]), step,
                         *key_row[4:9], *(None if value != value else int(value) for value in values))
        low, high = int(ranks.min()), int(ranks.max())
        if high != NULL:  # as :meth:`add`: the last ranked row in (rank, time, id) order
            j = k if low == high else _last(times, ids, np.flatnonzero(ranks == high))
            if (float(times[j]), int(ids[j])) >= self._rank_at:
                self.rank, self._rank_at = high, (float(times[j]), int(ids[j]))
        self.chunks.append((times, ids, *numbers))

    def ordered(self) -> tuple:
        """(times, steps, {metric: values}) in (time, id) order, each a contiguous array (a block's columns are
        strided views of the reader's rows: the leak test's many passes over each would cost a third more); the
        steps None where none were read (every chunk a block's, read without them)."""
        import numpy as np

        columns = list(zip(*self.chunks))

        def whole(at: int) -> Any:
            parts = columns[at]
            if len(parts) == 1:
                return None if parts[0] is None else np.ascontiguousarray(parts[0])
            return np.concatenate([np.full(len(chunk_times), np.nan) if part is None else part
                                   for part, chunk_times in zip(parts, columns[0])])

        times = whole(0)
        if self._unchecked and len(times) > 1 and bool((np.diff(times) < 0).any()):
            self._in_order = False  # a block's times going back (a clock set back: read as rows out of order)
        joined = [times, *(whole(at) for at in range(2, len(columns)))]  # the ids only to sort by
        if not self._in_order:
            order = np.lexsort((whole(1), times))
            joined = [None if column is None else column[order] for column in joined]
        return joined[0], joined[1], dict(zip(METRICS, joined[2:]))


def exact_last(store, chosen: Sequence[_Series]) -> None:
    """The newest sample's numbers, from its row, of each series whose floats could not hold them (``inexact``:
    past 2**53; the rows a pass sealed stay as they were written, ``v0``-``v4`` the :data:`METRICS`)."""
    inexact = {series.last[1]: series for series in chosen if series.inexact}
    ids = list(inexact)
    for start in range(0, len(ids), 5000):
        some = ids[start:start + 5000]
        for row in store._db.execute(f"SELECT id, v0, v1, v2, v3, v4 FROM entries WHERE id IN "
                                     f"({','.join('?' * len(some))})", some):
            series = inexact[row[0]]
            series.last, series.inexact = series.last[:9] + tuple(row[1:]), False


def _present(column) -> Any:
    """A float column's values (NaN: none), the column itself when it holds no NaN (no copy)."""
    import numpy as np

    missing = np.isnan(column)
    return column[~missing] if missing.any() else column


def _last(times, ids, among=None) -> int:
    """The place of the last of the samples ``among`` (places; None: all) in (time, id) order: the latest, the
    highest id among those as late (ids are unique): ``lexsort((ids, times))[-1]`` without the sort."""
    import numpy as np

    latest = np.flatnonzero(times == times.max()) if among is None else among[times[among] == times[among].max()]
    return int(latest[ids[latest].argmax()])


_NAN = float("nan")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _as_int(value: float | None) -> Any:
    """An integral float as the int it was stored as (bytes), anything else as it is."""
    return int(value) if value is not None and value == value and float(value).is_integer() else value


# ------------------------------------------------------------ thinned for charts

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], width: int = 30) -> str:
    """A one-line chart of ``values`` (thinned to ``width`` characters)."""
    points = [v for v in values if v is not None]
    if not points:
        return ""
    points = _thin(points, width)
    low, high = min(points), max(points)
    if high == low:
        return _BARS[0] * len(points)
    return "".join(_BARS[round((v - low) / (high - low) * (len(_BARS) - 1))] for v in points)


def _evenly(count: int, width: int) -> list[int]:
    """``width`` places spread evenly over ``count`` values, the first and the last among them (``count > width``)."""
    return [round(i * (count - 1) / (width - 1)) for i in range(width)]


def _thin(values: list[float], width: int = 60) -> list[float]:
    if len(values) <= width:
        return values
    return [values[at] for at in _evenly(len(values), width)]


def _thin_array(values, width: int = 60) -> list:
    """``[_as_int(v) for v in _thin(values, width)]`` of a numpy column: thinned before the values become Python
    numbers, and made ints in one call when every one is a whole number an int64 holds (bytes, as stored)."""
    import numpy as np

    kept = values if len(values) <= width else values[_evenly(len(values), width)]
    if bool((np.abs(kept) < 2.0**63).all()) and bool((kept == np.floor(kept)).all()):  # NaN fails both
        return kept.astype(np.int64).tolist()
    return [_as_int(value) for value in kept.tolist()]
