"""Memory snapshots on demand, a leak verdict over them, and a self-contained HTML report.

:class:`MemoryProfiler` — the HTML report has an inline SVG chart and works offline.
"""

from __future__ import annotations

import html
import json
import os
import time
from pathlib import Path
from typing import Any

from raysleuth import runtime
from raysleuth.memory.profile import profile_model
from raysleuth.memory.sampling import read_sample
from raysleuth.memory.trend import LeakPolicy, LeakVerdict, detect_leak
from raysleuth.recorder import record

__all__ = ["MemoryProfiler", "render_html"]


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
        self._baseline: Any = None  # a tracemalloc.Snapshot once taken
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
                profile = profile_model(self.model, 5, self.optimizer)
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
    points: dict[str, list[tuple[float, float]]] = {
        name: [(s["time"], s[name]) for s in snapshots if s.get(name) is not None] for name in series}
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
