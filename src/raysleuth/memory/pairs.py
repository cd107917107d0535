"""The pair sums under the leak test, exact and without garbage: every pair i < j of a few hundred samples.

:func:`raysleuth.memory.trend.theil_sen` takes the median of 41,000 pairwise slopes per fit, and the
Mann–Kendall count sums the signs of as many differences; at 1,000 workers that is two million pairs a fit.
The pairs' differences go into buffers reused per thread (:func:`_scratch`), and the median is selected among
the few thousand values around the middle (:func:`_median_in_place`); each answers what numpy's own
``np.median`` and a fresh array answered, to the bit.
"""

from __future__ import annotations

import functools
import math
import threading


def _median_in_place(values, skip: int = 0) -> float:
    """``np.median(values)``, the same value, in about a fifth of the time for the 41,000 slopes of 288 samples.

    ``np.median`` selects three times over everything (its two middle order statistics and a NaN check). Here
    the largest value tells whether any is NaN; a sorted sample of about a thousand values, evenly spaced, brackets the
    middle; one count and one cut keep the values inside the bracket (a few thousand), sorted, and the middle order
    statistics are read there, shifted by the count below. When the bracket misses the middle (an odd
    sample), everything is selected, as before. Ties change nothing: the values equal to a bound are inside.
    Reorders ``values``.

    ``skip``: the median of the values without the ``skip`` smallest, which the caller set to -inf (pairs it
    leaves out, without compressing them away): their order statistics, shifted by ``skip``.
    """
    import numpy as np

    top = values.max()
    if top != top:  # NaN somewhere: np.median gives NaN
        return math.nan
    counted = len(values) - skip
    half = counted // 2 + skip
    first = half if counted % 2 else half - 1  # the lower middle order statistic
    if len(values) >= 4096:
        sample = np.sort(values[:: len(values) // 1024])
        spread = 2 * int(math.sqrt(len(sample))) + 1  # four standard errors of the sample's middle
        middle = len(sample) // 2 if not skip else half * len(sample) // len(values)
        low = sample[max(0, middle - spread)]
        high = sample[min(len(sample) - 1, middle + spread)]
        below = int(np.count_nonzero(values < low))
        inside = values[(values >= low) & (values <= high)]
        if below <= first and below + len(inside) > half:  # sorted: numpy's selection crawls through long ties
            inside.sort()
            return _middle(inside, half - below, first - below)
    values.partition(half)
    return _middle(values, half, first, partitioned=True)


def _median_list(values: list[float]) -> float:
    """``np.median`` of a short list of floats (a fifth of a window), the same value, without numpy's overhead."""
    if not values or any(value != value for value in values):
        return math.nan
    ordered = sorted(map(float, values))
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def _middle(values, half: int, first: int, *, partitioned: bool = False) -> float:
    """The median from ``values`` sorted, or partitioned at ``half`` (the lower middle is then the largest below)."""
    middle = float(values[half])
    if first == half:
        return middle
    return (float(values[:half].max() if partitioned else values[first]) + middle) / 2


def _pair_differences(values, out, scratch):
    """``values[j] - values[i]`` for every pair i < j (:func:`_pairs`), written into ``out`` (``scratch`` is
    overwritten). ``mode="clip"``: with the default, numpy copies through a buffer of its own first."""
    import numpy as np

    i, j = _pairs(len(values))
    return np.subtract(np.take(values, j, out=out, mode="clip"), np.take(values, i, out=scratch, mode="clip"), out=out)


def _value_differences(values, scratch):
    """:func:`_pair_differences` of a series' values (read-only): the leak test takes them three times from one
    series (its Mann–Kendall count, the line in time, the line in steps), so the last series' are kept per
    thread and handed out again while the values are equal."""
    import numpy as np

    kept = getattr(_SCRATCH, "values", None)
    if kept is not None and len(kept[0]) == len(values) and np.array_equal(kept[0], values):
        return kept[1]
    differences = kept[1] if kept is not None and len(kept[1]) == len(scratch) else np.empty(len(scratch))
    differences.flags.writeable = True
    _pair_differences(values, differences, scratch)
    differences.flags.writeable = False
    _SCRATCH.values = (np.array(values, dtype=float), differences)
    return differences


_SCRATCH = threading.local()


def _scratch(size: int) -> tuple:
    """Three float buffers of ``size`` for this thread, reused call after call: a fresh 300 KB array per pair
    sum made the allocator hand pages back and take them again (a third of ``raysleuth memory``'s time at
    1,000 workers went to the kernel), same values either way."""
    import numpy as np

    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None or len(buffers[0]) != size:
        buffers = _SCRATCH.buffers = tuple(np.empty(size) for _ in range(3))
    return buffers


@functools.lru_cache(maxsize=8)
def _pairs(n: int):
    """Every index pair i < j of n points (cached: a run's workers share a few lengths; at most 600 points)."""
    import numpy as np

    i, j = np.triu_indices(n, k=1)
    i.flags.writeable = j.flags.writeable = False
    return i, j


def _mann_kendall_s(ys) -> int:
    """Sum over i < j of sign(ys[j] - ys[i]): per level, each right block against its sorted left sibling."""
    import numpy as np

    n = len(ys)
    if n <= 600:  # pairwise is faster here (the pairs are cached per length)
        diff, other, _ = _scratch(len(_pairs(n)[0]))
        return int(np.sign(_value_differences(ys, other), out=diff).sum())
    ranks = np.unique(ys, return_inverse=True)[1].astype(np.int64).reshape(-1)  # equal values, equal ranks
    size = 1 << (n - 1).bit_length()
    padded = np.zeros(size, dtype=np.int64)
    padded[:n] = ranks
    valid = np.arange(size) < n  # padding sits at the end: it is never left of a real sample
    key = int(ranks.max()) + 2
    total, block = 0, 1
    while block < size:
        pairs = padded.reshape(-1, 2, block)
        rows = np.arange(pairs.shape[0], dtype=np.int64)[:, None] * key
        left = (np.sort(pairs[:, 0, :], axis=1) + rows).reshape(-1)
        right = (pairs[:, 1, :] + rows).reshape(-1)
        mask = valid.reshape(-1, 2, block)[:, 1, :].reshape(-1)
        below = np.searchsorted(left, right, "left")
        above = np.searchsorted(left, right, "right")
        starts = np.repeat(np.arange(pairs.shape[0], dtype=np.int64) * block, block)
        # later sample above an earlier one: +1; below: -1
        total += int(((below - starts) - (starts + block - above))[mask].sum())
        block *= 2
    return total
