"""Leak detection as pure functions: no Ray, no psutil."""

from __future__ import annotations

import numpy as np
import pytest

from raysleuth.memory.trend import LeakPolicy, detect_leak, fit_trend, theil_sen
from raysleuth.memory.workers import sparkline

MiB = 1024 * 1024


def test_theil_sen_ignores_outliers():
    x = np.arange(50, dtype=float)
    y = 3.0 * x + 10
    y[[5, 17, 40]] += 1e6  # three wild spikes
    slope, intercept = theil_sen(x, y)
    assert slope == pytest.approx(3.0)
    assert intercept == pytest.approx(10.0)
    assert abs(np.polyfit(x, y, 1)[0] - 3.0) > 100  # least squares is dragged far off


def test_fit_reports_goodness_of_fit():
    x = np.arange(100, dtype=float)
    assert fit_trend(x, 5 * x).r2 == pytest.approx(1.0)
    noise = np.random.default_rng(1).normal(0, 1, 100)
    assert fit_trend(x, noise).r2 < 0.2


def test_steady_growth_is_a_leak_with_evidence():
    rng = np.random.default_rng(0)
    t = np.arange(60) * 0.5  # 30 s
    steps = list(range(60))
    y = 500 * MiB + 4 * MiB * np.arange(60) + rng.normal(0, 0.5 * MiB, 60)
    verdict = detect_leak(t, y, steps=steps)
    assert verdict.leak, verdict.reason
    assert verdict.slope_bytes_per_s == pytest.approx(8 * MiB, rel=0.05)
    assert verdict.slope_bytes_per_step == pytest.approx(4 * MiB, rel=0.05)
    assert verdict.r2 > 0.99
    assert verdict.samples == 48  # warm-up (20%) ignored
    assert verdict.growth_bytes == pytest.approx(8 * MiB * verdict.window_s, rel=0.05)


def test_flat_noisy_series_is_not_a_leak():
    rng = np.random.default_rng(2)
    for seed in range(20):
        rng = np.random.default_rng(seed)
        y = 500 * MiB + rng.integers(0, 50, 60) * MiB
        verdict = detect_leak(np.arange(60) * 0.1, y)
        assert not verdict.leak, (seed, verdict)


def test_warm_up_growth_then_flat_is_not_a_leak():
    t = np.arange(60, dtype=float)
    y = np.where(t < 10, 100 * MiB + t * 20 * MiB, 300 * MiB)
    assert not detect_leak(t, y).leak
    # but the same series without warm-up removal would look like growth
    assert detect_leak(t, y, policy=LeakPolicy(warmup_fraction=0)).slope_bytes_per_s >= 0


def test_small_slow_growth_is_below_the_bar():
    t = np.arange(60, dtype=float)
    y = 2000 * MiB + t * 10_000  # 600 KB over a minute: not worth an alarm
    verdict = detect_leak(t, y)
    assert not verdict.leak and "under" in verdict.reason


def test_too_few_samples_gives_no_verdict():
    verdict = detect_leak([0, 1, 2], [1, 2, 3])
    assert not verdict.leak and "fewer than" in verdict.reason
    assert detect_leak([], []).samples == 0
    assert detect_leak([0, 1, 2, 3], [None, None, None, 5]).samples == 1


def test_verdict_serialises():
    import json

    verdict = detect_leak(np.arange(30.0), np.arange(30.0) * MiB + 10 * MiB)
    assert json.loads(json.dumps(verdict.to_dict()))["leak"] is True


def test_sparkline():
    assert sparkline([1, 2, 3, 4]) == "▁▃▆█"
    assert sparkline([5, 5]) == "▁▁"
    assert sparkline([]) == ""
    assert len(sparkline(list(range(1000)), width=30)) == 30
