"""Python's ``round(x, digits)`` of a whole numpy column, to the bit, in a fraction of the time.

The report rounds the step total of every rank and step (299,000 at 1,000 ranks for an hour): one
``round`` call each took 0.09 s. ``np.round`` is not the same: it scales, rounds and scales back, and
near a half it can land on the other side of Python's correctly rounded answer.
"""

from __future__ import annotations

from typing import Any

__all__ = ["python_round"]


def python_round(values: Any, digits: int) -> Any:
    """``[round(x, digits) for x in values]`` as a float64 array: the same doubles, bit for bit.

    ``x * 10**digits`` is off the exact product by at most half a unit in its last place, so its nearest
    integer is the exact product's unless that lies within a few units of a half; the quotient of that
    integer by ``10**digits`` is then the double nearest the decimal Python rounds to. Every value near a
    half (or too large for the integers of a float) is rounded by Python itself.
    """
    import numpy as np

    values = np.asarray(values, dtype=float)
    scale = 10.0 ** digits
    scaled = values * scale
    out = np.rint(scaled) / scale
    magnitude = np.abs(scaled)
    doubt = (np.abs(scaled - np.floor(scaled) - 0.5) <= 4 * np.spacing(magnitude)) | ~(magnitude < 2.0 ** 52)
    for at in np.flatnonzero(doubt).tolist():
        out[at] = round(float(values[at]), digits)
    return out
