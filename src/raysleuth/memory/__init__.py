"""Memory: per-rank curves, leak verdicts, threshold triggers, who holds the bytes.

Inside a worker::

    import raysleuth as rs
    rs.memory.watch()                            # sample RSS/USS (+CUDA) every second
    rs.memory.on_threshold(20 * 2**30)           # capsule once when crossed
    rs.memory_breakpoint(18 * 2**30)             # inline: stop here when above
    rs.profile_memory_usage(model, optimizer=opt)  # exact bytes per module

From outside: ``raysleuth memory [--sample 30s]`` (node agents sample every
Ray worker, no code change) prints each worker's now, peak, trend and leak
verdict; exit 1 when a worker leaks.

Evidence: kind ``memory`` (data ``rss_bytes``, ``uss_bytes``,
``cuda_allocated_bytes``, ``cuda_reserved_bytes``, ``cuda_peak_bytes``,
``source``: ``watch`` | ``agent`` | ``profile`` | ``profiler`` | ``block``),
kind ``memory_capsule`` (stacks, holders, recent samples, CUDA snapshot path).

Modules: :mod:`.sampling` (reading memory, the sampler), :mod:`.trend`
(pure leak detection), :mod:`.triggers` (thresholds, capsules),
:mod:`.holders` (who holds the bytes), :mod:`.profile` (model profiles,
MemoryTrend), :mod:`.profiler` (MemoryProfiler and its HTML report),
:mod:`.blocks` (MemoryBufferManager), :mod:`.workers` (per-worker report
from the store, agent sampling).
"""

from __future__ import annotations

from raysleuth.memory.blocks import MemoryBufferManager
from raysleuth.memory.holders import top_holders
from raysleuth.memory.profile import MemoryProfile, MemoryTrend, ModuleMemory, profile_memory_usage
from raysleuth.memory.profiler import MemoryProfiler
from raysleuth.memory.sampling import Sampler, current_usage, cuda_in_use, read_sample, sampler, stop, watch
from raysleuth.memory.trend import LeakPolicy, LeakVerdict, TrendFit, detect_leak, fit_trend, theil_sen
from raysleuth.memory.triggers import ThresholdTrigger, capture_capsule, memory_breakpoint, on_threshold
from raysleuth.memory.workers import MemoryReport, SampleRun, WorkerMemory, memory_report, sample_workers, sparkline

__all__ = [
    "LeakPolicy",
    "LeakVerdict",
    "MemoryBufferManager",
    "MemoryProfile",
    "MemoryProfiler",
    "MemoryReport",
    "MemoryTrend",
    "ModuleMemory",
    "SampleRun",
    "Sampler",
    "ThresholdTrigger",
    "TrendFit",
    "WorkerMemory",
    "capture_capsule",
    "cuda_in_use",
    "current_usage",
    "detect_leak",
    "fit_trend",
    "memory_breakpoint",
    "memory_report",
    "on_threshold",
    "profile_memory_usage",
    "read_sample",
    "sample_workers",
    "sampler",
    "sparkline",
    "stop",
    "theil_sen",
    "top_holders",
    "watch",
]
