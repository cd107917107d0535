"""Threshold triggers: when memory crosses a line, leave a capsule of evidence (once).

- :func:`on_threshold` watches in the background (the :func:`watch` sampler)
  and fires once when the threshold is crossed: it records a
  ``memory_capsule`` (stacks of the process's threads, the top holders of
  the bytes, the recent samples) and then captures only, enters a
  breakpoint, or calls your function.
- :func:`memory_breakpoint` is an inline check placed in the training code
  (like ``breakpoint()``): when called above the threshold it leaves the
  same capsule and, with ``action="breakpoint"``, stops *in the calling
  thread* through :func:`raysleuth.breakpoints.breakpoint`. It fires once
  per call site. Below the threshold it costs one RSS read (~35 µs), or a
  dict lookup once fired.

With CUDA in use, arming a trigger also arms
``torch.cuda.memory._record_memory_history`` (Python stacks, bounded ring),
and firing dumps a snapshot next to the run's evidence
(``<home>/runs/<run>/memory/*.pickle``) that https://pytorch.org/memory_viz
opens. Without CUDA this is skipped and the capsule says why.

The top holders of the bytes are found by :mod:`.holders`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

from raysleuth import runtime
from raysleuth.memory.holders import top_holders
from raysleuth.memory.sampling import _torch_cuda, current_usage, read_sample, sampler, watch
from raysleuth.recorder import record
from raysleuth.redaction import redact_text

__all__ = ["ThresholdTrigger", "capture_capsule", "memory_breakpoint", "on_threshold"]

log = logging.getLogger("raysleuth.memory")


# ------------------------------------------------------------------- stacks


def _frames(frame, limit: int = 40) -> list[dict[str, Any]]:
    summary = traceback.extract_stack(frame, limit=limit)
    return [{"file": f.filename, "line": f.lineno, "function": f.name, "code": redact_text(f.line)} for f in summary]


def thread_stacks(*, skip_current: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Python stacks of this process's threads (raysleuth's own threads left out)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    stacks = {}
    me = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        name = names.get(ident, f"thread-{ident}")
        if name.startswith("raysleuth-") or (skip_current and ident == me):
            continue
        stacks[f"{name} ({ident})"] = _frames(frame)
    return stacks


# ---------------------------------------------------------------- snapshots

_history_armed = False


def arm_cuda_history(max_entries: int = 100_000) -> str | None:
    """Start recording CUDA allocations (with Python stacks) ahead of a trigger; the reason when skipped."""
    global _history_armed
    cuda = _torch_cuda()
    if cuda is None:
        return "CUDA is not in use in this process"
    if _history_armed:
        return None
    try:
        cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
        _history_armed = True
        return None
    except Exception as error:
        return f"could not arm CUDA memory history: {error}"


def _run_dir():
    home = runtime.settings().home
    ray = sys.modules.get("ray")
    run = "local"
    if ray is not None and ray.is_initialized():
        try:
            run = ray.get_runtime_context().get_session_name() or run
        except Exception:
            pass
    return home / "runs" / run


def dump_cuda_snapshot() -> tuple[str | None, str | None]:
    """Dump the armed CUDA snapshot; (path, None) or (None, why it was skipped)."""
    cuda = _torch_cuda()
    if cuda is None:
        return None, "CUDA is not in use in this process"
    if not _history_armed:
        return None, "CUDA memory history was not armed"
    try:
        folder = _run_dir() / "memory"
        folder.mkdir(parents=True, exist_ok=True)
        rank = runtime.get_rank()
        path = folder / f"snapshot-rank{rank if rank is not None else 'none'}-pid{os.getpid()}-{int(time.time())}.pickle"
        cuda.memory._dump_snapshot(str(path))
        return str(path), None
    except Exception as error:
        return None, f"snapshot failed: {error}"


# ----------------------------------------------------------------- capsules


def _metric_for(metric: str) -> str:
    if metric != "auto":
        return metric
    return "cuda_allocated_bytes" if _torch_cuda() is not None else "rss_bytes"


def _resolve_threshold(threshold: float, metric: str) -> float:
    """A threshold in (0, 1] is a fraction of the capacity (host RAM, or the GPUs' memory)."""
    if 0 < threshold <= 1:
        usage = current_usage()
        total = usage["cuda_total_bytes"] if metric.startswith("cuda") else usage["host_total_bytes"]
        if total:
            return threshold * total
    return float(threshold)


def capture_capsule(*, reason: str, metric: str, value: float | None, threshold: float | None,
                    name: str | None = None, recent: list[dict[str, Any]] | None = None,
                    stack_frame=None, holders: int = 10) -> dict[str, Any]:
    """Gather a capsule (stacks, top holders, recent samples, CUDA snapshot) and record it as ``memory_capsule``."""
    started = time.monotonic()
    capsule: dict[str, Any] = {
        "reason": reason, "metric": metric, "value_bytes": value, "threshold_bytes": threshold,
        "time": time.time(), "pid": os.getpid(), "rank": runtime.get_rank(),
    }
    try:
        capsule["stack"] = _frames(stack_frame) if stack_frame is not None else None
        capsule["threads"] = thread_stacks(skip_current=stack_frame is None)
    except Exception as error:
        capsule["stack_error"] = repr(error)
    try:
        capsule["now"] = read_sample()
    except Exception as error:
        capsule["now"] = {"error": repr(error)}
    capsule["recent_samples"] = list(recent or [])[-60:]
    try:
        capsule.update(top_holders(holders))
    except Exception as error:
        capsule["holders"], capsule["holders_error"] = [], repr(error)
    path, skipped = dump_cuda_snapshot()
    capsule["cuda_snapshot"] = path
    capsule["cuda_snapshot_skipped"] = skipped
    capsule["capture_seconds"] = time.monotonic() - started
    record("memory_capsule", capsule, name=name, level="WARNING")
    return capsule


def _enter_breakpoint(name: str) -> str | None:
    """Stop in the debugger through raysleuth.breakpoints; the reason when that was not possible."""
    try:
        # lazy: the debugger's machinery loads only when a memory breakpoint fires
        from raysleuth.breakpoints import breakpoint as debug_breakpoint
    except Exception as error:
        return f"raysleuth.breakpoints is not available ({error})"
    try:
        debug_breakpoint(name=name, when=True)
        return None
    except Exception as error:
        return f"breakpoint failed: {error!r}"


@dataclasses.dataclass
class ThresholdTrigger:
    """A background threshold watch: fires once, then keeps its capsule."""

    threshold_bytes: float
    metric: str
    action: str | Callable[[dict[str, Any]], Any]
    name: str
    fired: bool = False
    fired_at: float | None = None
    value_bytes: float | None = None
    capsule: dict[str, Any] | None = None
    error: str | None = None

    def _check(self, sample: dict[str, Any]) -> None:
        if self.fired:
            return
        value = sample.get(self.metric)
        if value is None or value < self.threshold_bytes:
            return
        self.fired, self.fired_at, self.value_bytes = True, time.time(), value

        current = sampler()
        if current is not None:
            current.remove_listener(self._check)
        recent = list(current.recent) if current is not None else [sample]
        self.capsule = capture_capsule(reason=f"{self.metric} {value:,.0f} crossed {self.threshold_bytes:,.0f}",
                                       metric=self.metric, value=value, threshold=self.threshold_bytes,
                                       name=self.name, recent=recent)
        if self.action == "breakpoint":
            self.error = _enter_breakpoint(self.name)
        elif callable(self.action):
            try:
                self.action(self.capsule)
            except Exception as error:
                self.error = f"callback failed: {error!r}"
                log.warning("raysleuth: memory threshold callback failed: %r", error)

    def cancel(self) -> None:
        """Stop watching (no-op once fired)."""
        current = sampler()
        if current is not None:
            current.remove_listener(self._check)


def on_threshold(threshold: float, action: str | Callable[[dict[str, Any]], Any] = "capture", *,
                 metric: str = "auto", interval: float = 1.0, name: str | None = None) -> ThresholdTrigger:
    """Fire once when this process's memory crosses ``threshold`` (bytes; (0, 1] = fraction of capacity).

    ``action``: ``"capture"`` (record a ``memory_capsule``), ``"breakpoint"``
    (the capsule, then :func:`raysleuth.breakpoints.breakpoint` from the
    sampler thread — use :func:`memory_breakpoint` to stop the training
    thread itself) or a callable given the capsule. ``metric``: ``auto``
    (CUDA allocated where CUDA is in use, else host RSS) or a sample field
    such as ``uss_bytes``. Starts :func:`watch` (``interval``) if needed.
    """
    if action not in ("capture", "breakpoint") and not callable(action):
        raise ValueError(f"action must be 'capture', 'breakpoint' or a callable, got {action!r}")
    chosen = _metric_for(metric)
    trigger = ThresholdTrigger(_resolve_threshold(threshold, chosen), chosen, action,
                               name or f"memory>{threshold:g}")
    if chosen.startswith("cuda"):
        arm_cuda_history()
    watch(interval).add_listener(trigger._check)
    return trigger


_fired_sites: dict[tuple[str, int], float] = {}


def memory_breakpoint(threshold: float, action: str = "breakpoint", *, metric: str = "auto",
                      name: str | None = None) -> bool:
    """Inline check: when this process is above ``threshold`` here, capture a capsule and stop (once per call site).

    Place it in the training loop. ``action="breakpoint"`` enters
    :func:`raysleuth.breakpoints.breakpoint` in this thread after the
    capsule; ``"capture"`` only records it. Returns True when it fired now.
    """
    try:
        caller = sys._getframe(1)
        site = (caller.f_code.co_filename, caller.f_lineno)
        if site in _fired_sites or runtime.settings().mode == "off":
            return False
        chosen = _metric_for(metric)
        if chosen.startswith("cuda"):
            arm_cuda_history()
            cuda = _torch_cuda()
            value = None if cuda is None else sum(
                (cuda.memory_allocated(i) if chosen == "cuda_allocated_bytes" else cuda.memory_reserved(i))
                for i in range(cuda.device_count()))
        elif chosen == "rss_bytes":
            value = read_sample(uss=False)["rss_bytes"]
        else:
            value = read_sample().get(chosen)
        limit = _resolve_threshold(threshold, chosen)
        if value is None or value < limit:
            return False
        _fired_sites[site] = time.time()

        current = sampler()
        label = name or f"memory_breakpoint {os.path.basename(site[0])}:{site[1]}"
        capture_capsule(reason=f"{chosen} {value:,.0f} above {limit:,.0f} at {os.path.basename(site[0])}:{site[1]}",
                        metric=chosen, value=value, threshold=limit, name=label,
                        recent=list(current.recent) if current is not None else None, stack_frame=caller)
        if action == "breakpoint":
            problem = _enter_breakpoint(label)
            if problem:
                log.warning("raysleuth: memory_breakpoint captured evidence but could not stop: %s", problem)
        return True
    except Exception as error:  # never take the step down
        log.warning("raysleuth: memory_breakpoint failed: %r", error)
        return False
