"""Monitoring modes: ``off``, ``light`` (cheap, always on) and ``full`` (everything).

The mode in force lives in :func:`raysleuth.runtime.settings` (``RAYSLEUTH_MODE``
sets the default; ``light`` unless said otherwise); what each mode turns on
lives in :mod:`raysleuth.modes` (:func:`mode_config`). Every instrument
reads them: with ``off`` each is one flag check and ``recorder.record``
returns at once.

:func:`enable_lightweight_monitoring` / :func:`enable_full_debugging` /
:func:`disable_monitoring` switch this process (settings, log levels, the
memory sampler, detailed Ray-call tracing when those features are
installed) and, given actor handles (``workers=[...]``), the same in each
of those workers through ``__ray_call__``: no change to the actor's class.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

from raysleuth import memory, modes, runtime, tracing
from raysleuth.logs import refresh_levels
from raysleuth.modes import ModeConfig
from raysleuth.ray_private import actor_id_hex, ray_call

__all__ = [
    "ModeConfig",
    "ModeResult",
    "apply_mode",
    "current_config",
    "disable_monitoring",
    "enable_full_debugging",
    "enable_lightweight_monitoring",
    "mode_config",
]

log = logging.getLogger("raysleuth.monitoring")


def mode_config(mode: str | None = None) -> ModeConfig:
    """What ``mode`` (default: the current one) turns on."""
    return modes.mode_config(runtime.settings().mode if mode is None else mode)


def current_config() -> ModeConfig:
    """The configuration of the mode in force now."""
    return mode_config(runtime.settings().mode)


@dataclasses.dataclass
class ModeResult:
    """What a mode switch did, here and in each worker it was sent to."""

    mode: str
    config: ModeConfig
    local: list[str]
    """What was switched in this process (``settings``, ``log level``, ``memory sampler 1.0s``...)."""
    workers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Per worker: ``actor_id``, ``ok``, ``applied`` or ``error``."""

    @property
    def ok(self) -> bool:
        """True when every worker switched."""
        return all(worker.get("ok") for worker in self.workers)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        result = dataclasses.asdict(self)
        result["ok"] = self.ok
        return result


_tracing_context = None


def apply_mode(mode: str, *, log_level: str | None = None) -> list[str]:
    """Switch this process to ``mode``; returns what was switched. Never raises for a missing feature."""
    global _tracing_context
    config = mode_config(mode)
    level = log_level or config.log_level or runtime.settings().log_level
    current = runtime.settings()
    keep = {field.name: getattr(current, field.name) for field in dataclasses.fields(current)}
    keep.update(mode=mode, log_level=level, memory_profile=mode == "full" or (current.memory_profile and mode != "off"))
    runtime.reload_settings(**keep)
    applied = [f"mode {mode}", f"log level {level}" if mode != "off" else "log shipping off"]
    try:
        refresh_levels()
    except Exception:
        pass
    # memory sampler
    try:
        if config.memory_interval_s is not None:
            sampler = memory.watch(interval=config.memory_interval_s)
            if sampler is not None and hasattr(sampler, "interval"):
                sampler.interval = config.memory_interval_s  # a slower mode slows it down too
            applied.append(f"memory sampler {config.memory_interval_s:g}s")
        else:
            memory.stop()
            applied.append("memory sampler stopped")
    except Exception as error:
        log.debug("memory sampler switch failed: %r", error)
    # detailed Ray-call tracing
    try:
        if config.detailed_tracing and _tracing_context is None:
            _tracing_context = tracing.enable_detailed_tracing()
            _tracing_context.__enter__()
            applied.append("detailed tracing on")
        elif not config.detailed_tracing and _tracing_context is not None:
            context, _tracing_context = _tracing_context, None
            context.__exit__(None, None, None)
            applied.append("detailed tracing off")
    except Exception as error:
        _tracing_context = None
        log.debug("detailed tracing switch failed: %r", error)
    return applied


def _apply_in_worker(_actor: Any, mode: str, log_level: str | None) -> list[str]:
    """Runs inside a worker through ``__ray_call__`` (first argument: the actor instance)."""
    return apply_mode(mode, log_level=log_level)


def _switch(mode: str, workers: Iterable[Any] | None, log_level: str | None, timeout: float) -> ModeResult:
    local = apply_mode(mode, log_level=log_level)
    result = ModeResult(mode=mode, config=mode_config(mode), local=local)
    handles = list(workers or [])
    if not handles:
        return result
    import ray

    pending = []
    for handle in handles:
        actor_id = None
        try:
            actor_id = actor_id_hex(handle)
            pending.append((actor_id, ray_call(handle, _apply_in_worker, mode, log_level)))
        except Exception as error:
            result.workers.append({"actor_id": actor_id, "ok": False, "error": f"{type(error).__name__}: {error}"})
    for actor_id, ref in pending:
        try:
            applied = ray.get(ref, timeout=timeout)
            result.workers.append({"actor_id": actor_id, "ok": True, "applied": applied})
        except Exception as error:
            result.workers.append({"actor_id": actor_id, "ok": False,
                                   "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"})
    return result


def enable_lightweight_monitoring(workers: Iterable[Any] | None = None, *, log_level: str | None = None,
                                  timeout: float = 30.0) -> ModeResult:
    """Cheap, always-on monitoring: heartbeats, phase spans, memory every 10 s, logs >= WARNING.

    ``workers``: actor handles to switch too (through ``__ray_call__``; each
    must be able to import raysleuth). ``log_level`` overrides the mode's.
    """
    return _switch("light", workers, log_level, timeout)


def enable_full_debugging(workers: Iterable[Any] | None = None, *, log_level: str | None = None,
                          timeout: float = 30.0) -> ModeResult:
    """Everything on: INFO logs, memory every second, spans for every call, detailed Ray-call tracing."""
    return _switch("full", workers, log_level, timeout)


def disable_monitoring(workers: Iterable[Any] | None = None, *, timeout: float = 30.0) -> ModeResult:
    """Every instrument a no-op (``RAYSLEUTH_MODE=off``) here and in ``workers``."""
    return _switch("off", workers, None, timeout)
