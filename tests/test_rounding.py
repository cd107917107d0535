"""``report.rounding``: Python's own ``round(x, digits)`` of a column, and ``round(fsum(column) / n, digits)`` of
every column of a table, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raysleuth.report.rounding import mean_rounded, python_round


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


@pytest.mark.parametrize("digits", [0, 2, 4])
def test_every_mean_is_the_one_fsum_gives(digits):
    """Columns whose sums numpy's order gets wrong (cancelling, far apart in size), means on a half of the last
    digit, and plain ones: each rounded mean is ``fsum``'s."""
    rng = np.random.default_rng(digits)
    tables = [rng.random((1200, 300)), rng.standard_normal((40, 200)) * 1e12,
              np.concatenate([rng.random((50, 100)) * 1e16, -rng.random((50, 100)) * 1e16, rng.random((3, 100))]),
              np.full((8, 50), 0.5 / 10.0**digits) + np.arange(50) / 10.0**digits,  # every mean a tie
              rng.integers(0, 3, (7, 400)) * (0.5 / 10.0**digits), np.array([[1e308, 1e308], [-1e308, 1e307]])]  # a bound past a float: fsum
    for table in tables:
        expected = [round(math.fsum(table[:, at].tolist()) / len(table), digits) for at in range(table.shape[1])]
        assert _bits(mean_rounded(table, digits)) == _bits(expected)
    naive = rng.random((1200, 300)).round(digits + 1) + 0.5 / 10.0**(digits + 1)
    assert mean_rounded(naive, digits) == [round(math.fsum(c) / 1200, digits) for c in naive.T.tolist()]
