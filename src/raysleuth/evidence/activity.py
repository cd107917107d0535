"""Kinds of what the job did: ``log``, ``span``, ``event``, ``heartbeat``, ``memory``, ``memory_capsule``."""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth.evidence.base import Evidence

__all__ = ["Event", "Heartbeat", "Log", "Memory", "MemoryCapsule", "Span"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Log(Evidence):
    """A log line shipped to the store. Version 1 rows (foreign writers, early shippers) named the text ``msg``."""

    KIND = "log"
    VERSION = 2
    WRITTEN_BY = ("`logs.StoreHandler` (every logger from `rs.get_logger` / `rs.DistributedLogger`, and the root "
                  "logger after `rs.install_log_shipping()`), records at or above `settings().log_level`; level = "
                  "the record's level name; rank/step/phase columns from `logger.info(msg, rank=, step=, phase=)` "
                  "or the process")
    NAMED = "the logger name"

    message: str = ""
    """Formatted."""
    template: str | None = None
    """The format string (lines that differ only in their arguments aggregate)."""
    module: str | None = None
    lineno: int | None = None
    funcName: str | None = None
    thread: str | None = None
    node: str | None = None
    actor: str | None = None
    args: tuple[str, ...] = ()
    exc_text: str | None = None
    stack_info: str | None = None
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Extra keywords, truncated."""

    @classmethod
    def version_of(cls, data: dict[str, Any]) -> int:
        """1 when the text is under ``msg`` (or ``text``) and not ``message``."""
        return 1 if "message" not in data and ("msg" in data or "text" in data) else 2

    @classmethod
    def upgrade(cls, data: dict[str, Any], version: int) -> dict[str, Any]:
        """Version 1: ``msg``/``text`` is the message."""
        if version == 1:
            return {**data, "message": data.get("msg", data.get("text"))}
        return data

    @property
    def level(self) -> str:
        """The level column, upper case (empty when the row has none)."""
        return (self.row.level or str(self.raw.get("level") or "")).upper()

    @property
    def logger(self) -> str:
        """The logger's name (the name column)."""
        return self.row.name or str(self.raw.get("logger") or "")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Span(Evidence):
    """A timed region (``rs.span``, ``@rs.trace``, a traced Ray call)."""

    KIND = "span"
    WRITTEN_BY = "`tracing.span`, `@tracing.trace`, `enable_detailed_tracing` (`ray.call:<fn>`), `rs.debug_decorator`"
    NAMED = "span name"
    NOTE = "step column = span's step, phase = its name; `attrs.task_id` for Ray calls"

    start: float | None = None
    end: float | None = None
    duration_s: float | None = None
    span_id: str | None = None
    parent_id: str | None = None
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    thread: str | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event(Evidence):
    """``rs.event(name, **fields)``: the keyword arguments given, in :attr:`raw`."""

    KIND = "event"
    WRITTEN_BY = "`tracing.event`"
    NAMED = "event name"
    NOTE = "the keyword arguments given (the named events below have their own fields)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Heartbeat(Evidence):
    """A rank's progress beat."""

    KIND = "heartbeat"
    WRITTEN_BY = ("`rs.heartbeat(step)`, `with rs.step(n):` (on entry); `raysleuth.collectives` every 2 s while "
                  "collectives advance (`source: collectives`), unless the job names its own steps")
    NAMED = "none"

    step: int | float | None = None
    """Also in the step column."""
    collectives: int | None = None
    source: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Memory(Evidence):
    """A memory sample. Version 1 rows (before sources) had no ``source``: the sampler's (``watch``)."""

    KIND = "memory"
    VERSION = 2
    WRITTEN_BY = ("`memory.watch` sampler (`watch`, every `interval` s), `raysleuth memory --sample` via the node "
                  "agents (`agent`: written by the CLI with the *sampled worker's* pid/node/actor and rank; no "
                  "client id), `MemoryTrend` (`profile`), `MemoryProfiler.take_snapshot` (`profiler`, `label`), "
                  "`MemoryBufferManager` (`block`)")
    NAMED = "none (`block`: the block's name)"
    NOTE = "leak trends use only `watch` and `agent`; CUDA fields are None without CUDA"

    rss_bytes: int | float | None = None
    uss_bytes: int | float | None = None
    vms_bytes: int | float | None = None
    cuda_allocated_bytes: int | float | None = None
    cuda_reserved_bytes: int | float | None = None
    cuda_peak_bytes: int | float | None = None
    cuda_devices: tuple[dict[str, Any], ...] = ()
    source: str = "watch"
    label: str | None = None
    pid: int | None = None
    node_ip: str | None = None
    metric: str | None = None
    start_bytes: int | None = None
    peak_bytes: int | None = None
    end_bytes: int | None = None
    budget_bytes: int | None = None
    over_budget: bool | None = None

    @classmethod
    def version_of(cls, data: dict[str, Any]) -> int:
        """1 for a sample without ``source``."""
        return 2 if "source" in data else 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryCapsule(Evidence):
    """What a memory threshold or ``memory_breakpoint`` caught."""

    KIND = "memory_capsule"
    WRITTEN_BY = "`memory.on_threshold`, `memory.memory_breakpoint`; level `WARNING`"
    NAMED = "the trigger's name"

    reason: str = ""
    metric: str | None = None
    value_bytes: int | None = None
    threshold_bytes: int | None = None
    time: float | None = None
    pid: int | None = None
    rank: int | None = None
    stack: Any = None
    threads: dict[str, Any] = dataclasses.field(default_factory=dict)
    now: dict[str, Any] = dataclasses.field(default_factory=dict)
    recent_samples: tuple[dict[str, Any], ...] = ()
    holders: tuple[dict[str, Any], ...] = ()
    scanned: Any = None
    partial: bool | None = None
    cuda_snapshot: str | None = None
    cuda_snapshot_skipped: str | None = None
    capture_seconds: float | None = None
