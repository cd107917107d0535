"""Float64 statistics of a tensor, in chunks, on its device (numpy or torch)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from raysleuth.fingerprints.result import TensorStats
from raysleuth.fingerprints.tensors import CHUNK_BYTES, NUMERIC_KINDS, import_torch

__all__ = ["stats_numpy", "stats_torch"]


def stats_numpy(array: np.ndarray) -> TensorStats | None:
    if array.dtype.kind not in NUMERIC_KINDS:
        return None
    stats = _StatsAccumulator()
    flat = array.reshape(-1)
    step = max(1, CHUNK_BYTES // 8)
    for start in range(0, flat.size, step):
        part = flat[start:start + step]
        values = np.abs(part).astype(np.float64) if part.dtype.kind == "c" else part.astype(np.float64)
        stats.add(values)
    return stats.result(int(flat.size))


def stats_torch(tensor: Any) -> TensorStats | None:
    torch = import_torch()
    if tensor.dtype in (getattr(torch, "float4_e2m1fn_x2", None),):
        return None  # packed sub-byte floats: no elementwise conversion
    flat = tensor.reshape(-1)
    stats = _StatsAccumulator()
    step = max(1, CHUNK_BYTES // 8)
    try:
        if flat.device.type != "cpu":
            return _stats_on_device(flat, torch)
        for start in range(0, flat.numel(), step):
            part = flat[start:start + step]
            if part.is_complex():
                part = part.abs()
            # narrow floats convert fastest through float32 (exact), then numpy float64 reductions
            narrow = part.is_floating_point() and part.element_size() <= 2
            values = part.to(torch.float32).numpy() if narrow else part.to(torch.float64).numpy()
            with np.errstate(invalid="ignore"):  # signalling NaN bit patterns
                stats.add(values.astype(np.float64))
    except (RuntimeError, TypeError):
        return None  # a dtype with no float conversion on this device
    return stats.result(int(flat.numel()))


DEVICE_STEP = 1 << 25
"""Elements per pass on a GPU (256 MiB of float64 at a time)."""


def _stats_on_device(flat: Any, torch: Any) -> TensorStats:
    """The same statistics summed on the device, in large chunks, with one copy to the host at the end.

    Chunk by chunk with a host read per figure (as on the CPU) waits on the
    GPU thousands of times: measured 2.4 GiB/s on an H200 for 1 GiB of bf16.
    """
    f64 = dict(dtype=torch.float64, device=flat.device)
    counts = torch.zeros(3, dtype=torch.int64, device=flat.device)  # nan, inf, finite
    sums = torch.zeros(3, **f64)  # l1, l2, total
    low, high = torch.tensor(math.inf, **f64), torch.tensor(-math.inf, **f64)
    for start in range(0, flat.numel(), DEVICE_STEP):
        part = flat[start:start + DEVICE_STEP]
        values = (part.abs() if part.is_complex() else part).to(torch.float64)
        finite = torch.isfinite(values)
        nan = torch.isnan(values).sum()
        finite_count = finite.sum()
        counts += torch.stack([nan, values.numel() - finite_count - nan, finite_count])
        kept = torch.where(finite, values, 0.0)
        sums += torch.stack([kept.abs().sum(), (kept * kept).sum(), kept.sum()])
        low = torch.minimum(low, torch.where(finite, values, math.inf).min())
        high = torch.maximum(high, torch.where(finite, values, -math.inf).max())
    (nan, inf, finite_count), (l1, l2, total), (low, high) = (
        counts.tolist(), sums.tolist(), torch.stack([low, high]).tolist())
    stats = _StatsAccumulator()
    stats.nan, stats.inf, stats.finite = int(nan), int(inf), int(finite_count)
    if stats.finite:
        stats.l1, stats.l2, stats.total, stats.min, stats.max = l1, l2, total, low, high
        stats.max_abs = max(abs(low), abs(high))
    return stats.result(int(flat.numel()))


class _StatsAccumulator:
    """Float64 running statistics over numpy chunks (a GPU tensor's are summed on the device instead)."""

    def __init__(self) -> None:
        self.nan = self.inf = self.finite = 0
        self.l1 = self.l2 = self.total = 0.0
        self.max_abs: float | None = None
        self.min: float | None = None
        self.max: float | None = None

    def add(self, values: np.ndarray) -> None:
        finite_mask = np.isfinite(values)
        if bool(finite_mask.all()):
            finite = values  # the common case: no mask, no copy
        else:
            nan = int(np.isnan(values).sum())
            self.nan += nan
            self.inf += int((~finite_mask).sum()) - nan
            finite = values[finite_mask]
        count = int(finite.size)
        if not count:
            return
        self.finite += count
        self.l1 += float(np.abs(finite).sum())
        self.l2 += float((finite * finite).sum())
        self.total += float(finite.sum())
        low, high = float(finite.min()), float(finite.max())
        self.min = low if self.min is None else min(self.min, low)
        self.max = high if self.max is None else max(self.max, high)
        top = max(abs(low), abs(high))
        self.max_abs = top if self.max_abs is None else max(self.max_abs, top)

    def result(self, count: int) -> TensorStats:
        stats = TensorStats(count=count, nan_count=self.nan, inf_count=self.inf)
        if self.finite:
            mean = self.total / self.finite
            stats.l1, stats.l2, stats.max_abs = self.l1, math.sqrt(self.l2), self.max_abs
            stats.min, stats.max, stats.mean = self.min, self.max, mean
            stats.std = math.sqrt(max(0.0, self.l2 / self.finite - mean * mean))
        return stats
