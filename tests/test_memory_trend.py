"""Leak detection as pure functions: no Ray, no psutil."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from raysleuth.memory.trend import LeakPolicy, _window, detect_leak, fit_trend, theil_sen
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
    # growth between the start and end levels (medians of the first and last fifth of the window)
    assert verdict.growth_bytes == pytest.approx(verdict.end_bytes - verdict.start_bytes)
    assert 0.7 * 8 * MiB * verdict.window_s < verdict.growth_bytes <= 8 * MiB * verdict.window_s


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
    assert not verdict.leak and verdict.status == "ok" and "no lasting growth" in verdict.reason


def test_too_few_samples_gives_no_verdict():
    verdict = detect_leak([0, 1, 2], [1, 2, 3])
    assert not verdict.leak and verdict.status == "not enough data" and "not enough data" in verdict.reason
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


# ---------------------------------------------------- recorded shapes (issue 17)

SHAPES = json.loads((Path(__file__).parent / "data" / "memory_shapes.json").read_text())["shapes"]


def _judge(name: str, **policy):
    shape = SHAPES[name]
    return detect_leak(shape["times"], shape["uss_bytes"], policy=LeakPolicy(**policy) if policy else None)


@pytest.mark.parametrize("name, status, pattern", [
    ("linear", "leak", "steady"),
    ("step", "leak", "steady"),
    ("plateau_after_climb", "leak", "climb"),
    ("recent_growth", "leak", "recent"),
    ("sawtooth_gc", "ok", None),
    ("noisy_flat", "ok", None),
    ("short_window", "not enough data", None),
])
def test_recorded_shapes(name, status, pattern):
    verdict = _judge(name)
    assert (verdict.status, verdict.pattern) == (status, pattern), verdict.reason
    assert verdict.leak is (status == "leak")
    if status != "leak":
        assert "ok" not in verdict.reason.split()  # the reason never claims more than the data holds


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_without_lines_the_verdict_is_the_same_and_only_a_quiet_series_loses_its_lines(name):
    """``lines=False`` (the report's quiet workers past 16): a leak keeps its evidence in full; a series without
    one keeps its verdict, reason and levels, and has no slope, R² or tau."""
    shape = SHAPES[name]
    steps = list(range(len(shape["times"])))
    full = detect_leak(shape["times"], shape["uss_bytes"], steps=steps).to_dict()
    bare = detect_leak(shape["times"], shape["uss_bytes"], steps=steps, lines=False).to_dict()
    lines = ("slope_bytes_per_s", "slope_bytes_per_step", "r2", "tau")
    if full["leak"]:
        assert bare == full
    else:
        assert {k: v for k, v in bare.items() if k not in lines} == {k: v for k, v in full.items() if k not in lines}
        assert all(bare[k] is None for k in lines)
        assert full["status"] == "not enough data" or full["slope_bytes_per_s"] is not None


@pytest.mark.parametrize("n", [3, 10, 57, 288, 2878, 5000])
def test_a_column_is_judged_as_its_list_to_the_bit(n):
    """The leak test's measures of a float column (numpy: a full-mode window's 2,900 samples) are those of the
    same values as a list (Python's sorts and minima), bit for bit, for every shape."""
    import numpy as np

    from raysleuth.memory.trend import LeakPolicy, _judge

    rng = np.random.default_rng(n)
    t = np.arange(n, dtype=float)
    shapes = [np.full(n, 6e9), 6e9 + rng.integers(0, 2**20, n).astype(float),  # flat; noisy, integer bytes
              6e9 + 4 * MiB * t, 6e9 + 2 * MiB * np.floor(t / 7),  # steady; a staircase
              6e9 + 300 * MiB * (t > n / 3) + rng.normal(0, MiB, n),  # a climb, then flat
              6e9 + 400 * MiB * np.maximum(0, t - 0.7 * n) / max(1, n), 6e9 - 3 * MiB * t,  # recent; shrinking
              6e9 + (t % 50) * 10 * MiB, np.round(rng.normal(6e9, 5e7, n))]  # a sawtooth; rounded noise
    for column in shapes:
        for evidence in (True, False):
            as_column = _judge(column.copy(), LeakPolicy(), evidence=evidence)
            as_list = _judge(column.tolist(), LeakPolicy(), evidence=evidence)
            assert json.dumps(as_column) == json.dumps(as_list) and all(
                type(value) is type(as_list[key]) for key, value in as_column.items()), (n, evidence)


def test_climb_then_plateau_from_the_issue_is_a_leak():
    """345 -> 826 MiB over 8 s, then flat: the old verdict said "ok, no steady growth (R²=0.74)"."""
    t = np.arange(0, 16, 0.5)
    y = np.where(t < 8, 345 + (826 - 345) * t / 8, 826) * MiB
    verdict = detect_leak(t, y)
    assert verdict.leak and verdict.pattern == "climb", verdict.reason
    assert verdict.r2 < 0.8  # the line fit alone would have missed it


def test_plus_4_mib_per_snapshot_is_a_leak():
    """USS rising exactly +4 MiB per MemoryProfiler snapshot, snapshots at irregular times: old verdict R²=0.54."""
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.choice([0.05, 0.1, 3.0], size=12))
    y = 900 * MiB + np.arange(12) * 4 * MiB
    verdict = detect_leak(t, y, policy=LeakPolicy(min_samples=5))
    assert verdict.leak and verdict.pattern == "steady", verdict.reason


def test_eight_samples_is_not_enough_data_never_ok():
    """`memory --sample 10s` gave 8 samples: the old verdict said "ok, ... fewer than the 10 needed"."""
    verdict = detect_leak(np.arange(8.0), np.full(8, 300 * MiB))
    assert verdict.status == "not enough data" and not verdict.leak
    assert verdict.reason.startswith("not enough data")


def test_sawtooth_whose_troughs_rise_is_a_leak():
    t = np.arange(60.0)
    y = (200 + (t % 6) * 20 + (t // 6) * 15) * MiB  # GC brings it down, but each trough is higher
    verdict = detect_leak(t, y)
    assert verdict.leak, verdict.reason


def test_memory_command_says_not_enough_data_never_ok(tmp_path, capsys):
    """`raysleuth memory` after `--sample 10s` (8 samples): the old table said "ok" and exited 0."""
    from raysleuth.cli import main
    from raysleuth.recorder.store import open_run

    store = open_run(tmp_path, "short")
    for n in range(8):
        store.add("memory", {"rss_bytes": 400 * MiB, "uss_bytes": 300 * MiB + n * MiB, "source": "agent",
                             "pid": 4242, "node_ip": "10.0.0.1"}, time=1000.0 + n, rank=1, pid=4242)
    code = main(["memory", "--run", "short", "--home", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1 and "not enough data" in out
    assert " ok " not in out and "no leak" not in out
    code = main(["memory", "--run", "short", "--home", str(tmp_path), "--json"])
    assert code == 1 and json.loads(capsys.readouterr().out)["verdict"] == "not enough data"


def test_a_cache_that_settles_after_warm_up_is_not_a_leak():
    """A healthy job: +15% in its first third (allocator pools, caches filling), then flat."""
    t = np.arange(60.0)
    y = np.where(t < 20, 500 + t * 3.75, 575) * MiB  # 500 -> 575 MiB, done by a third of the window
    verdict = detect_leak(t, y)
    assert verdict.status == "ok", verdict.reason


def test_the_window_is_every_point_past_the_warm_up_as_tested_one_by_one():
    """``_window`` keeps a reader's columns as they are when no value is missing and cuts the warm-up as a slice:
    the same window as testing each point (NaN values dropped, times sorted, each time's distance from the first),
    times with inf among them included."""
    policy, rng = LeakPolicy(), np.random.default_rng(4)

    def one_by_one(times, values, steps):
        keep = values == values
        t, v, s = times[keep], values[keep], None if steps is None else steps[keep]
        if len(t) > 1 and not bool((t[1:] >= t[:-1]).all()):
            order = np.argsort(t, kind="stable")
            t, v, s = t[order], v[order], None if s is None else s[order]
        skip = int(math.ceil(len(t) * policy.warmup_fraction)) if len(t) >= 2 else 0
        inside = np.flatnonzero(t[skip:] - (t[0] if len(t) else 0.0) >= policy.warmup_seconds) + skip
        return len(t), t[inside], v[inside], None if s is None else s[inside]

    for case in range(600):
        n = int(rng.integers(0, 300))
        times = np.sort(rng.random(n) * rng.choice([10, 100, 1000, 5000])) if case % 3 else rng.random(n) * 1000
        if n > 2 and case % 11 == 0:
            times[-1] = np.inf
        if n > 2 and case % 13 == 0:
            times[0] = -np.inf
        values = rng.random(n)
        if case % 2 and n:
            values[rng.random(n) < 0.2] = np.nan
        steps = rng.random(n) if case % 5 == 0 else None
        got, expected = _window(times, values, steps, policy), one_by_one(times, values, steps)
        assert got[0] == expected[0], case
        for mine, theirs in zip(got[1:], expected[1:]):
            assert (mine is None and theirs is None) or np.array_equal(mine, theirs, equal_nan=True), case
