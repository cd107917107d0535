"""Who holds the bytes in a model, memory snapshots over time, and peak-measured blocks.

- :func:`profile_memory_usage` — exact bytes per module: parameters,
  gradients, buffers and (given the optimizer) its state, each tensor
  counted once, attributed to the module that owns it directly, so the
  modules add up to the total. The seed's trend form
  ``profile_memory_usage(model, batch, interval=10, output_file=...)``
  returns a :class:`MemoryTrend`: call it once per step; every ``interval``
  steps it records a sample (store and JSON file).
- :class:`MemoryProfiler` — snapshots on demand, a leak verdict over them,
  and a self-contained HTML report (inline SVG chart, works offline).
- :class:`MemoryBufferManager` — ``with MemoryBufferManager(budget_bytes=...)``:
  frees cached memory first, measures the peak inside the block, records it,
  warns past the budget.
"""

from __future__ import annotations

import dataclasses
import gc
import html
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from raysleuth import runtime
from raysleuth.memory.sampling import _torch_cuda, read_sample
from raysleuth.memory.trend import LeakPolicy, LeakVerdict, detect_leak
from raysleuth.recorder import record

__all__ = ["MemoryBufferManager", "MemoryProfile", "MemoryProfiler", "MemoryTrend", "ModuleMemory",
           "profile_memory_usage"]

log = logging.getLogger("raysleuth.memory")


@dataclasses.dataclass
class ModuleMemory:
    """Bytes one module owns directly (not its children's)."""

    name: str
    kind: str
    parameters_bytes: int = 0
    gradients_bytes: int = 0
    buffers_bytes: int = 0
    optimizer_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Everything this module holds."""
        return self.parameters_bytes + self.gradients_bytes + self.buffers_bytes + self.optimizer_bytes


@dataclasses.dataclass
class MemoryProfile:
    """A model's memory: totals and the top modules."""

    parameters_bytes: int
    gradients_bytes: int
    buffers_bytes: int
    optimizer_bytes: int
    total_bytes: int
    modules: list[ModuleMemory]
    """The ``top_n`` modules by total bytes."""
    module_count: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with each module's total."""
        result = dataclasses.asdict(self)
        for entry, module in zip(result["modules"], self.modules):
            entry["total_bytes"] = module.total_bytes
        return result


def _tensor_bytes(tensor) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


def _optimizer_state_bytes(optimizer, parameter) -> int:
    torch = sys.modules["torch"]
    state = optimizer.state.get(parameter, {}) if optimizer is not None else {}
    return sum(_tensor_bytes(v) for v in state.values() if isinstance(v, torch.Tensor))


def _profile(model, top_n: int, optimizer) -> MemoryProfile:
    seen: set[int] = set()
    modules = []
    for name, module in model.named_modules():
        entry = ModuleMemory(name=name or "(root)", kind=type(module).__name__)
        for parameter in module.parameters(recurse=False):
            if id(parameter) in seen:
                continue  # tied weights: counted once, at their first owner
            seen.add(id(parameter))
            entry.parameters_bytes += _tensor_bytes(parameter)
            if parameter.grad is not None:
                entry.gradients_bytes += _tensor_bytes(parameter.grad)
            entry.optimizer_bytes += _optimizer_state_bytes(optimizer, parameter)
        for buffer in module.buffers(recurse=False):
            if id(buffer) in seen:
                continue
            seen.add(id(buffer))
            entry.buffers_bytes += _tensor_bytes(buffer)
        modules.append(entry)
    totals = {field: sum(getattr(m, field) for m in modules)
              for field in ("parameters_bytes", "gradients_bytes", "buffers_bytes", "optimizer_bytes")}
    top = sorted((m for m in modules if m.total_bytes), key=lambda m: m.total_bytes, reverse=True)[:top_n]
    return MemoryProfile(total_bytes=sum(totals.values()), modules=top, module_count=len(modules), **totals)


def _batch_bytes(batch) -> int:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(batch, torch.Tensor):
        return _tensor_bytes(batch)
    if isinstance(batch, dict):
        return sum(_batch_bytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(_batch_bytes(v) for v in batch)
    nbytes = getattr(batch, "nbytes", None)
    return int(nbytes) if isinstance(nbytes, int) else 0


class MemoryTrend:
    """The seed's trend form: call once per step; every ``interval`` steps a sample is kept.

    Each kept sample (process memory plus the model's totals) is recorded as
    kind ``memory`` (``source: "profile"``) and the whole series is rewritten
    to ``output_file`` as JSON (``{"interval", "batch_bytes", "samples": [...],
    "leak": {...}}``).
    """

    def __init__(self, model, batch=None, *, interval: int = 10, output_file: str | Path | None = None,
                 optimizer=None) -> None:
        if interval < 1:
            raise ValueError(f"interval must be >= 1 step, got {interval!r}")
        self.model, self.optimizer = model, optimizer
        self.interval = int(interval)
        self.output_file = Path(output_file) if output_file else None
        self.batch_bytes = _batch_bytes(batch) if batch is not None else None
        self.samples: list[dict[str, Any]] = []
        self.calls = 0

    def __call__(self, step: int | None = None) -> dict[str, Any] | None:
        """Count one step; on every ``interval``-th, sample and return the sample."""
        self.calls += 1
        step = step if step is not None else self.calls
        if (self.calls - 1) % self.interval:
            return None
        try:
            sample = read_sample()
            sample.pop("cuda_devices", None)
            sample.update(time=time.time(), step=step)
            if self.model is not None:
                profile = _profile(self.model, 0, self.optimizer)
                sample.update(model_parameters_bytes=profile.parameters_bytes,
                              model_gradients_bytes=profile.gradients_bytes,
                              model_optimizer_bytes=profile.optimizer_bytes)
            self.samples.append(sample)
            record("memory", {**{k: v for k, v in sample.items() if k not in ("time", "step")}, "source": "profile"},
                   step=step, time_=sample["time"])
            self._write()
            return sample
        except Exception as error:
            log.warning("raysleuth: memory trend sample failed: %r", error)
            return None

    step = __call__

    def leak(self, policy: LeakPolicy | None = None) -> LeakVerdict:
        """The leak verdict over the kept samples (host USS)."""
        return detect_leak([s["time"] for s in self.samples], [s.get("uss_bytes") for s in self.samples],
                           steps=[s["step"] for s in self.samples], policy=policy)

    def _write(self) -> None:
        if self.output_file is None:
            return
        payload = {"interval": self.interval, "batch_bytes": self.batch_bytes, "samples": self.samples,
                   "leak": self.leak().to_dict()}
        tmp = self.output_file.with_name(self.output_file.name + ".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        os.replace(tmp, self.output_file)


def profile_memory_usage(model, batch_or_top_n: Any = 10, *, top_n: int | None = None, optimizer=None,
                         interval: int | None = None, output_file: str | Path | None = None):
    """Exact per-module bytes of a torch model; or, with a batch/interval/output_file, a :class:`MemoryTrend`.

    ``profile_memory_usage(model, top_n=10, optimizer=opt)`` returns a
    :class:`MemoryProfile` now. ``profile_memory_usage(model, batch,
    interval=10, output_file="memory_profile.json")`` returns a
    :class:`MemoryTrend` to call once per step.
    """
    trend_form = interval is not None or output_file is not None or not isinstance(batch_or_top_n, int)
    if trend_form:
        batch = None if isinstance(batch_or_top_n, int) else batch_or_top_n
        return MemoryTrend(model, batch, interval=interval or 10, output_file=output_file, optimizer=optimizer)
    return _profile(model, top_n if top_n is not None else batch_or_top_n, optimizer)


# ------------------------------------------------------------ MemoryProfiler


class MemoryProfiler:
    """Snapshots on demand, a leak verdict over them, and an HTML report.

    ``track_allocations=True`` starts :mod:`tracemalloc` (Python allocations
    only; it slows allocation-heavy code, so it is opt-in in hot jobs) and
    each snapshot lists the allocation sites that grew most since the first.
    :meth:`close` (or leaving a ``with`` block) stops the tracing it started;
    the snapshots and the verdict stay.
    """

    def __init__(self, model=None, *, track_allocations: bool = True, leak_detection: bool = True,
                 optimizer=None, policy: LeakPolicy | None = None) -> None:
        self.model, self.optimizer = model, optimizer
        self.track_allocations = track_allocations
        self.leak_detection = leak_detection
        self.policy = policy or LeakPolicy(min_samples=5)
        self.snapshots: list[dict[str, Any]] = []
        self._baseline = None
        self._started_tracing = False
        if track_allocations:
            import tracemalloc

            if not tracemalloc.is_tracing():
                tracemalloc.start(5)
                self._started_tracing = True

    def close(self) -> None:
        """Stop :mod:`tracemalloc` if this profiler started it (tracing slows every allocation after)."""
        if self._started_tracing:
            import tracemalloc

            tracemalloc.stop()
            self._started_tracing = False

    def __enter__(self) -> MemoryProfiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def take_snapshot(self, label: str | None = None) -> dict[str, Any]:
        """Sample memory now (and the model's totals, and allocation growth); returns the snapshot."""
        snapshot = read_sample()
        snapshot.pop("cuda_devices", None)
        snapshot.update(time=time.time(), step=runtime.current_step(), label=label or f"#{len(self.snapshots)}")
        if self.model is not None:
            try:
                profile = _profile(self.model, 5, self.optimizer)
                snapshot["model"] = {k: v for k, v in profile.to_dict().items() if k != "modules"}
            except Exception as error:
                snapshot["model"] = {"error": repr(error)}
        if self.track_allocations:
            snapshot["allocation_growth"] = self._allocation_growth()
            import tracemalloc

            if tracemalloc.is_tracing():
                snapshot["python_traced_bytes"] = tracemalloc.get_traced_memory()[0]
        self.snapshots.append(snapshot)
        record("memory", {**{k: v for k, v in snapshot.items() if k in ("rss_bytes", "uss_bytes", "cuda_allocated_bytes",
                                                                            "cuda_reserved_bytes", "cuda_peak_bytes")},
                          "source": "profiler", "label": snapshot["label"]}, time_=snapshot["time"])
        return snapshot

    def _allocation_growth(self, top: int = 10) -> list[dict[str, Any]]:
        import tracemalloc

        if not tracemalloc.is_tracing():
            return []
        current = tracemalloc.take_snapshot().filter_traces((
            tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>")))
        if self._baseline is None:
            self._baseline = current
            return []
        stats = current.compare_to(self._baseline, "lineno")
        return [{"where": f"{s.traceback[0].filename}:{s.traceback[0].lineno}", "size_diff_bytes": s.size_diff,
                 "count_diff": s.count_diff, "size_bytes": s.size} for s in stats[:top] if s.size_diff > 0]

    @property
    def leak_verdict(self) -> LeakVerdict:
        """The verdict over the snapshots so far: CUDA allocated where in use, else host USS.

        With ``track_allocations``, the Python heap tracemalloc sees is judged
        too: a process that freed much earlier keeps those pages, and new
        objects reuse them without USS moving. A leak in either is a leak.
        """
        metric = "cuda_allocated_bytes" if any(s.get("cuda_allocated_bytes") for s in self.snapshots) else "uss_bytes"
        metrics = [metric] + (["python_traced_bytes"] if metric == "uss_bytes" and any(
            s.get("python_traced_bytes") for s in self.snapshots) else [])
        verdicts = [detect_leak([s["time"] for s in self.snapshots], [s.get(m) for s in self.snapshots],
                                steps=[s.get("step") for s in self.snapshots], policy=self.policy, metric=m)
                    for m in metrics]
        return next((v for v in verdicts if v.leak), verdicts[0])

    @property
    def leak_detected(self) -> bool:
        """True when leak detection is on and the snapshots show a leak."""
        return self.leak_detection and self.leak_verdict.leak

    def generate_report(self, path: str | Path) -> Path:
        """Write a self-contained HTML report (chart, verdict, allocation growth); returns its path."""
        path = Path(path)
        path.write_text(render_html(self.snapshots, self.leak_verdict if self.leak_detection else None), encoding="utf-8")
        return path


def _svg_chart(snapshots: list[dict[str, Any]], series: tuple[str, ...], width: int = 720, height: int = 260) -> str:
    colours = {"rss_bytes": "#1f77b4", "uss_bytes": "#2ca02c", "cuda_allocated_bytes": "#d62728",
               "cuda_reserved_bytes": "#ff7f0e"}
    points = {name: [(s["time"], s.get(name)) for s in snapshots if s.get(name) is not None] for name in series}
    points = {k: v for k, v in points.items() if v}
    if not points:
        return "<p>No samples.</p>"
    t0 = min(t for values in points.values() for t, _ in values)
    t1 = max(t for values in points.values() for t, _ in values)
    top = max(v for values in points.values() for _, v in values) * 1.05 or 1
    pad = 50

    def xy(t, v):
        x = pad + (t - t0) / ((t1 - t0) or 1) * (width - 2 * pad)
        return f"{x:.1f},{height - pad - v / top * (height - 2 * pad):.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<rect width="{width}" height="{height}" fill="white" stroke="#ccc"/>']
    for i in range(5):
        value = top * i / 4
        y = height - pad - i / 4 * (height - 2 * pad)
        parts.append(f'<line x1="{pad}" x2="{width - pad}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="4" y="{y + 4:.1f}" font-size="10">{value / 2**20:.0f} MiB</text>')
    for index, (name, values) in enumerate(points.items()):
        colour = colours.get(name, "#555")
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                     f'points="{" ".join(xy(t, v) for t, v in values)}"><title>{name}</title></polyline>')
        parts.append(f'<text x="{pad + index * 150}" y="{height - 12}" font-size="12" fill="{colour}">{name}</text>')
    parts.append(f'<text x="{width - pad}" y="{height - pad + 14}" font-size="10" text-anchor="end">'
                 f'{t1 - t0:.1f} s</text></svg>')
    return "".join(parts)


def render_html(snapshots: list[dict[str, Any]], verdict: LeakVerdict | None) -> str:
    """The HTML report of :meth:`MemoryProfiler.generate_report` (no external resources)."""
    series = ("rss_bytes", "uss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes")
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
            s.get("label"), time.strftime("%H:%M:%S", time.localtime(s["time"])), s.get("step"),
            *(f"{s[k] / 2**20:.1f}" if s.get(k) is not None else "" for k in series))) + "</tr>"
        for s in snapshots)
    growth = snapshots[-1].get("allocation_growth", []) if snapshots else []
    growth_rows = "".join(f"<tr><td>{html.escape(g['where'])}</td><td>{g['size_diff_bytes'] / 2**20:.2f}</td>"
                          f"<td>{g['count_diff']}</td></tr>" for g in growth)
    if verdict is None:
        verdict_html = "<p>Leak detection off.</p>"
    else:
        colour = "#b00" if verdict.leak else "#070" if verdict.status == "ok" else "#a60"
        title = "LEAK" if verdict.leak else "no leak" if verdict.status == "ok" else "not enough data"
        verdict_html = (f'<p style="color:{colour}"><b>{title}</b>: '
                        f"{html.escape(verdict.reason)}</p><pre>{html.escape(json.dumps(verdict.to_dict(), indent=1))}</pre>")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>raysleuth memory report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ddd;padding:2px 8px;text-align:right}}</style>
</head><body><h1>Memory report</h1><p>pid {os.getpid()}, rank {runtime.get_rank()}, {len(snapshots)} snapshots</p>
{_svg_chart(snapshots, series)}
<h2>Leak verdict</h2>{verdict_html}
<h2>Snapshots (MiB)</h2><table><tr><th>label</th><th>time</th><th>step</th>{"".join(f"<th>{k}</th>" for k in series)}</tr>{rows}</table>
<h2>Allocation growth since the first snapshot</h2><table><tr><th>where</th><th>MiB</th><th>objects</th></tr>{growth_rows}</table>
</body></html>"""


# ------------------------------------------------------- MemoryBufferManager


def _read_hwm() -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark (Linux ``clear_refs`` 5); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


class MemoryBufferManager:
    """Context manager: free cached memory, measure the block's peak, record it, warn past a budget.

    Host peak: the kernel's peak-RSS mark, reset on entry (Linux), else a
    5 ms polling thread. CUDA peak: ``torch.cuda.max_memory_allocated``
    after ``reset_peak_memory_stats``. After the block: :attr:`peak_bytes`,
    :attr:`peak_increase_bytes`, :attr:`over_budget`; one ``memory`` record
    (``source: "block"``, ``name``).
    """

    def __init__(self, budget_bytes: float | None = None, *, name: str = "block", free_cache: bool = True) -> None:
        self.budget_bytes = budget_bytes
        self.name = name
        self.free_cache = free_cache
        self.metric = "rss_bytes"
        self.start_bytes: int | None = None
        self.peak_bytes: int | None = None
        self.end_bytes: int | None = None
        self.over_budget = False
        self._poll_peak = 0
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._hwm = False

    @property
    def peak_increase_bytes(self) -> int | None:
        """Peak inside the block minus the level on entry."""
        if self.peak_bytes is None or self.start_bytes is None:
            return None
        return self.peak_bytes - self.start_bytes

    def _now(self) -> int | None:
        cuda = _torch_cuda()
        if cuda is not None:
            return sum(int(cuda.memory_allocated(i)) for i in range(cuda.device_count()))
        return read_sample(uss=False)["rss_bytes"]

    def _poll(self) -> None:
        while not self._stop.wait(0.005):
            value = self._now() or 0
            self._poll_peak = max(self._poll_peak, value)

    def __enter__(self) -> "MemoryBufferManager":
        try:
            if self.free_cache:
                gc.collect()
            cuda = _torch_cuda()
            if cuda is not None:
                self.metric = "cuda_allocated_bytes"
                if self.free_cache:
                    cuda.empty_cache()
                for i in range(cuda.device_count()):
                    cuda.reset_peak_memory_stats(i)
            self.start_bytes = self._now()
            if cuda is None:
                self._hwm = _reset_hwm() and _read_hwm() is not None
                if not self._hwm:
                    self._poll_peak = self.start_bytes or 0
                    self._stop = threading.Event()
                    self._thread = threading.Thread(target=self._poll, name="raysleuth-memory-block", daemon=True)
                    self._thread.start()
        except Exception as error:
            log.warning("raysleuth: MemoryBufferManager could not start measuring: %r", error)
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            self.end_bytes = self._now()
            cuda = _torch_cuda()
            if cuda is not None:
                self.peak_bytes = sum(int(cuda.max_memory_allocated(i)) for i in range(cuda.device_count()))
            elif self._hwm:
                self.peak_bytes = _read_hwm()
            elif self._stop is not None:
                self._stop.set()
                self._thread.join(1.0)
                self.peak_bytes = max(self._poll_peak, self.end_bytes or 0)
            self.over_budget = bool(self.budget_bytes is not None and self.peak_bytes is not None
                                    and self.peak_bytes > self.budget_bytes)
            record("memory", {"source": "block", "metric": self.metric, "start_bytes": self.start_bytes,
                              "peak_bytes": self.peak_bytes, "end_bytes": self.end_bytes,
                              "budget_bytes": self.budget_bytes, "over_budget": self.over_budget},
                   name=self.name, level="WARNING" if self.over_budget else None)
            if self.over_budget:
                log.warning("raysleuth: %s peaked at %.1f MiB, over its budget of %.1f MiB (rank %s)",
                            self.name, self.peak_bytes / 2**20, self.budget_bytes / 2**20, runtime.get_rank())
        except Exception as error:
            log.warning("raysleuth: MemoryBufferManager could not finish measuring: %r", error)
