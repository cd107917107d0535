"""``report.rounding.python_round``: Python's own ``round(x, digits)`` of a column, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from raysleuth.report.rounding import python_round


def _bits(values) -> list[int]:
    return np.asarray(values, dtype=float).view(np.int64).tolist()


@pytest.mark.parametrize("digits", [0, 2, 3, 4])
def test_every_value_rounds_to_the_double_python_rounds_to(digits):
    rng = np.random.default_rng(digits)
    halves = (rng.integers(-10**6, 10**6, 20_000) + 0.5) / 10.0 ** digits  # ties, as near as a double can be
    columns = [rng.random(50_000) * 10, rng.random(50_000) * 1e-3, rng.standard_normal(50_000) * 1e6, halves,
               np.round(rng.random(20_000), digits + 1), rng.random(1_000) * 1e17,  # past a float's integers
               np.array([0.0, -0.0, -0.00001, 5e-5, 1.00005, 2.675, 0.125, -2.5, 2.0**53, -1e300, 5e-324])]
    for column in columns:
        assert _bits(python_round(column, digits)) == _bits([round(float(x), digits) for x in column])


def test_numpys_own_round_is_not_the_same():
    """What the helper is for: ``np.round`` lands on the other side of some halves."""
    column = np.array([2.675, 1.0000500000000001, 0.28500000000000003] + [k / 1000 + 0.0005 for k in range(2000)])
    python = [round(float(x), 3) for x in column]
    assert _bits(np.round(column, 3)) != _bits(python)
    assert _bits(python_round(column, 3)) == _bits(python)
