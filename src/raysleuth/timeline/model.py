"""The timeline's results and its tracks: one Perfetto process per node, one thread per worker."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["StepPhase", "Timeline"]


@dataclasses.dataclass(kw_only=True)
class Timeline:
    """Trace events and what went into them."""

    events: list[dict[str, Any]]
    """The trace events (empty after :func:`export_timeline`, which streams them to the file)."""
    spans: int = 0
    instant_events: int = 0
    memory_samples: int = 0
    ray_tasks: int = 0
    run: str | None = None
    path: str | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)
    written: int | None = None
    """Trace events written to ``path`` (an export)."""
    cut_since: float | None = None
    """Where a trace over its budget starts (:mod:`raysleuth.timeline.budget`); None: nothing was cut."""
    left_out: int = 0
    """Records of the selection before :attr:`cut_since`, left out of the trace (a warning says so)."""

    def to_chrome(self) -> dict[str, Any]:
        """The Chrome trace JSON object (``traceEvents`` + metadata)."""
        return {"traceEvents": self.events, "displayTimeUnit": "ms",
                "otherData": {"generator": "raysleuth", "run": self.run, "warnings": self.warnings}}

    def to_dict(self) -> dict[str, Any]:
        """A summary of the export (not the events)."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                  if field.name not in ("events", "written")}
        return {**fields, "warnings": list(self.warnings),
                "trace_events": self.written if self.written is not None else len(self.events)}


@dataclasses.dataclass(kw_only=True)
class StepPhase:
    """One step's phase across ranks: the straggler view."""

    step: int
    phase: str
    durations: dict[str, float]
    """Seconds per rank (``"3"``) or, without a rank, per worker (``"pid 1234"``)."""
    median_s: float
    slowest: str
    slowest_s: float
    lag_s: float
    """How far the slowest is behind the median."""
    lag_ratio: float


# ----------------------------------------------------------------- building


class _Tracks:
    """pid per node, tid per worker, and their names (metadata events)."""

    def __init__(self) -> None:
        self.node_pids: dict[str, int] = {}
        self.thread_names: dict[tuple[int, int], str] = {}
        self.node_names: dict[int, str] = {}
        self.seen: dict[tuple, tuple[int, int]] = {}
        """(node id, node ip, worker pid, rank, class) of a writer -> its (pid, tid), once its track is made."""

    def pid(self, node_id: str | None, node_ip: str | None = None, is_head: bool = False) -> int:
        key = node_id or "local"
        if key not in self.node_pids:
            self.node_pids[key] = len(self.node_pids) + 1
            label = f"node {node_ip or '?'}" + (" (head)" if is_head else "") + (f" {key[:8]}" if node_id else "")
            self.node_names[self.node_pids[key]] = label
        elif node_ip and "?" in self.node_names[self.node_pids[key]]:
            self.node_names[self.node_pids[key]] = self.node_names[self.node_pids[key]].replace("?", node_ip)
        return self.node_pids[key]

    def tid(self, pid: int, worker_pid: int | None, label: str | None) -> int:
        tid = int(worker_pid or 0)
        current = self.thread_names.get((pid, tid))
        if label and (current is None or current.startswith("pid ")):
            self.thread_names[(pid, tid)] = label
        elif current is None:
            self.thread_names[(pid, tid)] = f"pid {tid}"
        return tid

    def metadata(self) -> list[dict[str, Any]]:
        events = []
        for pid, name in sorted(self.node_names.items()):
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                           "args": {"sort_index": pid}})
        for (pid, tid), name in sorted(self.thread_names.items()):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}})
            rank = name.split(" ", 2)[1] if name.startswith("rank ") else None
            if rank and rank.isdigit():
                events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": 0,
                               "args": {"sort_index": int(rank)}})
        return events


def _label(rank: int | None, actor_class: str | None, pid: int | None, role: str | None = None) -> str:
    parts = []
    if rank is not None:
        parts.append(f"rank {rank} ·")
    parts.append(actor_class or role or "worker")
    return " ".join(parts) + f" ({pid})"


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def _number(value: Any, default: float) -> float:
    """A stored number, or ``default`` when a row holds something else (text, a list, nan)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return float(default)
    return number if math.isfinite(number) else float(default)
