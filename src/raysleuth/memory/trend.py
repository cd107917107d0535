"""Leak detection: a robust trend over memory samples, and a verdict with its evidence.

Pure functions on plain numbers (no Ray, no psutil), unit-tested alone.

The method: drop the warm-up (the first ``warmup_fraction`` of the window,
and anything before ``warmup_seconds``: allocators, caches and lazy imports
grow there without leaking), fit a Theil–Sen line (the median of pairwise
slopes: one GC pause or a spike cannot tilt it) and measure how well the
line explains the samples (R² of that line). A leak is a positive slope that
explains the data (R² ≥ ``min_r2``) and adds up to real growth over the
window (≥ ``min_growth_bytes`` and ≥ ``min_growth_fraction`` of the level at
the start). A flat but noisy process has a slope near zero and a low R²; a
process that grew once and then stayed flat (a cache filling) has a poor
line fit, because the growth is not steady.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["LeakPolicy", "LeakVerdict", "TrendFit", "detect_leak", "fit_trend", "theil_sen"]

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TrendFit:
    """A line through (x, y): slope in y-units per x-unit, and how well it fits."""

    slope: float
    intercept: float
    r2: float
    n: int


def theil_sen(x: Sequence[float], y: Sequence[float], *, max_points: int = 300) -> tuple[float, float]:
    """Theil–Sen estimate (slope, intercept): median pairwise slope, median residual intercept.

    O(n²) pairs, so longer series are thinned evenly to ``max_points`` first.
    """
    import numpy as np

    xs = np.asarray(x, dtype=float)
    ys = np.asarray(y, dtype=float)
    if len(xs) != len(ys):
        raise ValueError(f"x and y differ in length ({len(xs)} != {len(ys)})")
    if len(xs) < 2:
        return 0.0, float(ys[0]) if len(ys) else 0.0
    if len(xs) > max_points:
        keep = np.linspace(0, len(xs) - 1, max_points).round().astype(int)
        xs, ys = xs[keep], ys[keep]
    i, j = np.triu_indices(len(xs), k=1)
    dx = xs[j] - xs[i]
    usable = dx != 0
    if not usable.any():
        return 0.0, float(np.median(ys))
    slope = float(np.median((ys[j] - ys[i])[usable] / dx[usable]))
    intercept = float(np.median(ys - slope * xs))
    return slope, intercept


def fit_trend(x: Sequence[float], y: Sequence[float]) -> TrendFit:
    """Theil–Sen line through the points, with the R² of that line (1 = a perfect line)."""
    import numpy as np

    slope, intercept = theil_sen(x, y)
    xs = np.asarray(x, dtype=float)
    ys = np.asarray(y, dtype=float)
    if len(ys) < 2:
        return TrendFit(slope, intercept, 0.0, len(ys))
    residual = float(((ys - (slope * xs + intercept)) ** 2).sum())
    total = float(((ys - ys.mean()) ** 2).sum())
    r2 = 1.0 - residual / total if total > 0 else 0.0
    return TrendFit(slope, intercept, max(-1.0, r2), len(ys))


@dataclasses.dataclass(frozen=True, kw_only=True)
class LeakPolicy:
    """When a trend counts as a leak."""

    warmup_fraction: float = 0.2
    """Leading share of the samples ignored (warm-up growth is not a leak)."""
    warmup_seconds: float = 0.0
    """Also ignore samples in the first this-many seconds."""
    min_samples: int = 10
    """Fewer samples after warm-up: no verdict (``leak`` False, reason says so)."""
    min_r2: float = 0.8
    """The line must explain this much of the variance."""
    min_growth_bytes: float = 8 * MiB
    """Total growth over the window must reach this many bytes..."""
    min_growth_fraction: float = 0.05
    """...and this fraction of the level at the window's start."""


@dataclasses.dataclass
class LeakVerdict:
    """Is this series leaking, and the evidence: slope, fit, window, growth."""

    leak: bool
    reason: str
    metric: str = "uss_bytes"
    samples: int = 0
    """Samples in the window (after warm-up)."""
    slope_bytes_per_s: float | None = None
    slope_bytes_per_step: float | None = None
    r2: float | None = None
    window_start: float | None = None
    window_end: float | None = None
    window_s: float | None = None
    start_bytes: float | None = None
    end_bytes: float | None = None
    growth_bytes: float | None = None
    growth_fraction: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The verdict as a JSON-ready dict."""
        return dataclasses.asdict(self)


def detect_leak(
    times: Sequence[float],
    values: Sequence[float | None],
    *,
    steps: Sequence[int | None] | None = None,
    policy: LeakPolicy | None = None,
    metric: str = "uss_bytes",
) -> LeakVerdict:
    """Fit a trend to one process's memory series and decide whether it leaks.

    ``times`` in seconds (any origin), ``values`` in bytes (None entries are
    skipped), ``steps`` optional training steps (gives bytes per step).
    """
    policy = policy or LeakPolicy()
    points = [(float(t), float(v), s) for t, v, s in zip(times, values, steps or [None] * len(times)) if v is not None]
    points.sort(key=lambda point: point[0])
    if len(points) < 2:
        return LeakVerdict(False, f"only {len(points)} sample(s): no trend", metric=metric, samples=len(points))
    first_time = points[0][0]
    skip = int(math.ceil(len(points) * policy.warmup_fraction))
    window = [p for p in points[skip:] if p[0] - first_time >= policy.warmup_seconds]
    if len(window) < policy.min_samples:
        return LeakVerdict(False, f"{len(window)} samples after warm-up, fewer than the {policy.min_samples} needed",
                           metric=metric, samples=len(window))
    origin = window[0][0]
    xs = [p[0] - origin for p in window]
    ys = [p[1] for p in window]
    fit = fit_trend(xs, ys)
    span = xs[-1] - xs[0]
    start = fit.intercept
    end = fit.intercept + fit.slope * span
    growth = fit.slope * span
    fraction = growth / start if start > 0 else (1.0 if growth > 0 else 0.0)
    per_step = None
    stepped = [(s, p[1]) for p in window if (s := p[2]) is not None]
    if len({s for s, _ in stepped}) >= 3:
        per_step = theil_sen([s for s, _ in stepped], [v for _, v in stepped])[0]
    verdict = LeakVerdict(
        False, "", metric=metric, samples=len(window), slope_bytes_per_s=fit.slope, slope_bytes_per_step=per_step,
        r2=fit.r2, window_start=window[0][0], window_end=window[-1][0], window_s=span,
        start_bytes=start, end_bytes=end, growth_bytes=growth, growth_fraction=fraction,
    )
    if fit.slope <= 0:
        verdict.reason = "flat or shrinking"
    elif fit.r2 < policy.min_r2:
        verdict.reason = f"no steady growth (line fit R²={fit.r2:.2f} < {policy.min_r2})"
    elif growth < policy.min_growth_bytes:
        verdict.reason = f"grew {growth / MiB:.1f} MiB over {span:.0f}s, under {policy.min_growth_bytes / MiB:.0f} MiB"
    elif fraction < policy.min_growth_fraction:
        verdict.reason = f"grew {fraction:.1%} over {span:.0f}s, under {policy.min_growth_fraction:.0%}"
    else:
        verdict.leak = True
        verdict.reason = (f"steady growth of {fit.slope / MiB:.2f} MiB/s (R²={fit.r2:.2f}), "
                          f"+{growth / MiB:.1f} MiB ({fraction:.0%}) over {span:.0f}s")
    return verdict
