"""raysleuth: find the culprit when distributed training on Ray goes wrong.

The public API. Names resolve lazily (``import raysleuth`` imports neither
Ray nor torch), and each one lives in the module named for what it does.
Import from here, never from a private module.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> module that defines it (or the module itself, for names such as
# ``memory`` mapped to ``raysleuth.memory``). One line each, sorted by name.
_EXPORTS: dict[str, str] = {
    "Advice": "raysleuth.advise",
    "AuthTokenMissing": "raysleuth.errors",
    "CaptureTimeout": "raysleuth.errors",
    "Check": "raysleuth.doctor",
    "ClusterUnreachable": "raysleuth.errors",
    "CollectivesReport": "raysleuth.collectives",
    "ConsistencyReport": "raysleuth.consistency",
    "CrashCapsule": "raysleuth.postmortem",
    "DeadActor": "raysleuth.tasks",
    "DebugSession": "raysleuth.breakpoints",
    "DistributedLogger": "raysleuth.logs",
    "DoctorReport": "raysleuth.doctor",
    "EvidenceStore": "raysleuth.recorder",
    "FailedTask": "raysleuth.tasks",
    "Fingerprint": "raysleuth.fingerprints",
    "Identity": "raysleuth.runtime",
    "MemoryBufferManager": "raysleuth.memory",
    "MemoryProfiler": "raysleuth.memory",
    "Mismatch": "raysleuth.consistency",
    "ModeConfig": "raysleuth.modes",
    "PendingTask": "raysleuth.tasks",
    "ProblemFound": "raysleuth.errors",
    "ProcessStack": "raysleuth.stacks",
    "RankFilter": "raysleuth.logs",
    "RayResourcePool": "raysleuth.pool",
    "RaySleuthError": "raysleuth.errors",
    "SeedReport": "raysleuth.consistency",
    "Settings": "raysleuth.runtime",
    "SmartResourceAllocator": "raysleuth.pool",
    "Span": "raysleuth.tracing",
    "StackReport": "raysleuth.stacks",
    "StallEvent": "raysleuth.stall",
    "StepPhase": "raysleuth.timeline",
    "StoreCorrupt": "raysleuth.errors",
    "StoreNotFound": "raysleuth.errors",
    "StuckTask": "raysleuth.tasks",
    "SyncCheck": "raysleuth.weights",
    "TaskReport": "raysleuth.tasks",
    "TaskTrace": "raysleuth.tasks",
    "TensorInspection": "raysleuth.consistency",
    "TensorStats": "raysleuth.fingerprints",
    "ThreadStack": "raysleuth.stacks",
    "Timeline": "raysleuth.timeline",
    "ToolMissing": "raysleuth.errors",
    "UsageError": "raysleuth.errors",
    "Watchdog": "raysleuth.stall",
    "WeightCheck": "raysleuth.weights",
    "WeightsReport": "raysleuth.weights",
    "WorkerGroup": "raysleuth.pool",
    "WorkerNotFound": "raysleuth.errors",
    "breakpoint": "raysleuth.breakpoints",
    "breakpoint_on_rank": "raysleuth.breakpoints",
    "capture_crashes": "raysleuth.postmortem",
    "check_consistency": "raysleuth.consistency",
    "check_data_consistency": "raysleuth.consistency",
    "check_distributed_consistency": "raysleuth.consistency",
    "check_gradient_sync": "raysleuth.consistency",
    "check_weight_sync": "raysleuth.weights",
    "collect_collectives": "raysleuth.collectives",
    "collective_culprits": "raysleuth.collectives",
    "compare": "raysleuth.consistency",
    "conditional_breakpoint": "raysleuth.breakpoints",
    "connect": "raysleuth.cluster",
    "debug_decorator": "raysleuth.logs",
    "disable_monitoring": "raysleuth.monitoring",
    "distributed_logger": "raysleuth.logs",
    "dump_stacks": "raysleuth.stacks",
    "enable_detailed_tracing": "raysleuth.tracing",
    "enable_full_debugging": "raysleuth.monitoring",
    "enable_lightweight_monitoring": "raysleuth.monitoring",
    "event": "raysleuth.tracing",
    "explain_error": "raysleuth.explain",
    "explain_exception": "raysleuth.explain",
    "export_timeline": "raysleuth.timeline",
    "find_deaths": "raysleuth.deaths",
    "find_tasks": "raysleuth.tasks",
    "fingerprint": "raysleuth.fingerprints",
    "fingerprint_many": "raysleuth.fingerprints",
    "flush": "raysleuth.recorder",
    "generate_report": "raysleuth.report",
    "get_advice": "raysleuth.advise",
    "get_logger": "raysleuth.logs",
    "get_rank": "raysleuth.runtime",
    "heartbeat": "raysleuth.progress",
    "inspect_distributed_tensor": "raysleuth.consistency",
    "inspect_tensor": "raysleuth.consistency",
    "install_crash_capture": "raysleuth.postmortem",
    "install_crash_capture_on_instance": "raysleuth.postmortem",
    "install_log_shipping": "raysleuth.logs",
    "instrument": "raysleuth.pool",
    "list_crashes": "raysleuth.postmortem",
    "logprob_gap": "raysleuth.weights",
    "memory": "raysleuth.memory",
    "memory_breakpoint": "raysleuth.memory",
    "memory_report": "raysleuth.memory",
    "mode_config": "raysleuth.monitoring",
    "open_store": "raysleuth.recorder",
    "post_mortem_session": "raysleuth.breakpoints",
    "profile_memory_usage": "raysleuth.memory",
    "record": "raysleuth.recorder",
    "redact": "raysleuth.redaction",
    "run_doctor": "raysleuth.doctor",
    "set_random_seed": "raysleuth.consistency",
    "set_rank": "raysleuth.runtime",
    "settings": "raysleuth.runtime",
    "setup_worker": "raysleuth.worker_setup",
    "span": "raysleuth.tracing",
    "stacks": "raysleuth.stacks",
    "step": "raysleuth.progress",
    "timeline_summary": "raysleuth.timeline",
    "trace": "raysleuth.tracing",
    "trace_ray_task": "raysleuth.tasks",
    "verify_distributed_tensors": "raysleuth.consistency",
    "watchdog": "raysleuth.stall",
    "weights_received": "raysleuth.weights",
    "weights_sent": "raysleuth.weights",
    "whoami": "raysleuth.runtime",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raysleuth' has no attribute {name!r}")
    imported = importlib.import_module(module)
    # A name that is its own module (``rs.memory``) resolves to the module,
    # unless the module defines that name itself (``rs.heartbeat`` is a function).
    if module == f"{__name__}.{name}" and not hasattr(imported, name):
        value = imported
    else:
        value = getattr(imported, name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
