"""Pure logic of task forensics: why a task waits, which calls are stuck, why an actor died.

Everything here takes plain values and the State API's records
(:mod:`raysleuth.cluster.records`) and returns plain values, so it is unit
tested without Ray.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from raysleuth.cluster.records import RayActor, RayTask

__all__ = [
    "PENDING_STATES",
    "RUNNING_STATES",
    "TERMINAL_STATES",
    "death_cause",
    "fit_problem",
    "is_stuck",
    "largest_capacity",
    "pg_problem",
    "robust_stats",
    "seconds",
    "short_name",
    "started_at",
    "upstream_task_id",
]

#: Task states in which a task has not started running yet.
PENDING_STATES = frozenset({
    "NIL",
    "PENDING_ARGS_AVAIL",
    "PENDING_NODE_ASSIGNMENT",
    "PENDING_OBJ_STORE_MEM_AVAIL",
    "PENDING_ARGS_FETCH",
    "SUBMITTED_TO_WORKER",
    "PENDING_ACTOR_TASK_ARGS_FETCH",
    "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY",
})
RUNNING_STATES = frozenset({"RUNNING", "RUNNING_IN_RAY_GET", "RUNNING_IN_RAY_WAIT"})
TERMINAL_STATES = frozenset({"FINISHED", "FAILED"})

_EPSILON = 1e-9


def _fmt(value: float) -> str:
    return f"{value:g}"


def _is_internal(resource: str) -> bool:
    return resource.startswith("node:") or resource.startswith("bundle_group_") or "_group_" in resource


def largest_capacity(resource: str, capacities: Sequence[Mapping[str, float]]) -> float:
    """The most of ``resource`` any one node has (0 when none has it)."""
    return max((float(node.get(resource, 0.0)) for node in capacities), default=0.0)


def fit_problem(required: Mapping[str, float] | None, capacities: Sequence[Mapping[str, float]]) -> str | None:
    """Why no node could ever run a request of ``required`` resources, or ``None`` if one could.

    ``capacities`` are the alive nodes' total resources. The answer names the
    resource and the largest node's capacity, e.g. ``needs GPU: 1, but no
    node has any GPU`` or ``needs CPU: 64, the largest node has CPU: 8``.
    """
    wanted = {key: float(value) for key, value in (required or {}).items() if value and not _is_internal(key)}
    if not wanted:
        return None
    if not capacities:
        return "no alive node in the cluster"
    for node in capacities:
        if all(float(node.get(key, 0.0)) + _EPSILON >= value for key, value in wanted.items()):
            return None
    # No single node fits: name the first resource that no node has enough of,
    # else say it is the combination.
    for key, value in sorted(wanted.items()):
        largest = largest_capacity(key, capacities)
        if largest + _EPSILON < value:
            if largest == 0:
                return f"needs {key}: {_fmt(value)}, but no node has any {key}"
            return f"needs {key}: {_fmt(value)}, the largest node has {key}: {_fmt(largest)}"
    asked = ", ".join(f"{key}: {_fmt(value)}" for key, value in sorted(wanted.items()))
    return f"needs {asked} on one node; each resource exists, but no single node has all of it"


def pg_problem(bundles: Sequence[Mapping[str, float]], strategy: str | None,
               capacities: Sequence[Mapping[str, float]]) -> str | None:
    """Why a placement group can never be created on these nodes, or ``None``.

    Each bundle must fit a node; ``STRICT_PACK`` needs the sum on one node;
    ``STRICT_SPREAD`` needs as many fitting nodes as bundles; every strategy
    needs the sum to exist in the cluster.
    """
    for index, bundle in enumerate(bundles):
        problem = fit_problem(bundle, capacities)
        if problem:
            return f"bundle {index} {problem}"
    total: dict[str, float] = {}
    for bundle in bundles:
        for key, value in bundle.items():
            total[key] = total.get(key, 0.0) + float(value)
    strategy = (strategy or "").upper()
    if strategy == "STRICT_PACK":
        problem = fit_problem(total, capacities)
        if problem:
            return f"STRICT_PACK of all {len(bundles)} bundles {problem}"
    for key, value in sorted(total.items()):
        if _is_internal(key):
            continue
        cluster_total = sum(float(node.get(key, 0.0)) for node in capacities)
        if cluster_total + _EPSILON < value:
            return f"bundles need {key}: {_fmt(value)} in all, the cluster has {key}: {_fmt(cluster_total)}"
    if strategy == "STRICT_SPREAD":
        for index, bundle in enumerate(bundles):
            fitting = sum(1 for node in capacities if fit_problem(bundle, [node]) is None)
            if fitting < len(bundles):
                return (f"STRICT_SPREAD of {len(bundles)} bundles needs {len(bundles)} nodes that fit bundle "
                        f"{index}, the cluster has {fitting}")
    return None


def upstream_task_id(object_id: str) -> str:
    """The id of the task that produces an object (an object id is its task id plus an index)."""
    return object_id[:48] if len(object_id) >= 48 else object_id


def robust_stats(values: Iterable[float]) -> tuple[float, float]:
    """``(median, MAD)`` of ``values`` (MAD scaled to a normal's standard deviation)."""
    data = sorted(float(value) for value in values)
    if not data:
        return 0.0, 0.0
    median = statistics.median(data)
    mad = statistics.median(abs(value - median) for value in data) * 1.4826
    return median, mad


def is_stuck(elapsed_s: float, peer_durations: Sequence[float], *, factor: float = 5.0, floor_s: float = 10.0,
             min_peers: int = 3) -> tuple[bool, float | None]:
    """Whether a call running for ``elapsed_s`` is far beyond its peers; returns ``(stuck, median)``.

    Stuck means: at least ``min_peers`` peers, running longer than ``floor_s``,
    longer than ``factor`` times the peers' median, and beyond the median by
    more than 5 robust standard deviations (MAD), so noisy functions do not
    trip it.
    """
    if len(peer_durations) < min_peers:
        return False, None
    median, mad = robust_stats(peer_durations)
    stuck = elapsed_s > floor_s and elapsed_s > factor * median and elapsed_s > median + 5 * mad
    return stuck, median


_DEATH_REASONS = {
    "RAY_KILL": ("killed", "killed with ray.kill"),
    "OUT_OF_MEMORY": ("oom_killed", "OOM-killed by Ray's memory monitor"),
    "NODE_DIED": ("node_died", "its node died"),
    "WORKER_DIED": ("worker_died", "its worker process died (killed by a signal, the kernel OOM killer, or a crash)"),
    "OWNER_DIED": ("owner_died", "its owner (the process that created it) died"),
    "REF_DELETED": ("out_of_scope", "every handle to it went out of scope"),
    "NODE_PREEMPTION": ("node_preempted", "its node was preempted"),
    "UNSCHEDULABLE": ("unschedulable", "it could not be scheduled"),
}


def death_cause(actor: RayActor | Mapping[str, Any]) -> dict[str, Any]:
    """Classify a dead actor's death cause: ``{"cause", "summary", "reason", "message"}``.

    ``actor``: its record, or the State API row it is built from.
    """
    cause = (actor if isinstance(actor, RayActor) else RayActor.from_state(actor)).death
    if cause.kind == "creation_failed":
        return {"cause": "constructor_failed", "summary": "its constructor (__init__) raised",
                "reason": "CREATION_TASK_ERROR", "message": cause.formatted_exception or cause.error_message}
    if cause.kind == "unschedulable":
        return {"cause": "unschedulable", "summary": "it could not be scheduled",
                "reason": "UNSCHEDULABLE", "message": cause.error_message}
    if cause.kind == "runtime_env_failed":
        return {"cause": "runtime_env_failed", "summary": "its runtime_env could not be set up",
                "reason": "RUNTIME_ENV_FAILED", "message": cause.error_message}
    reason = str(cause.reason or "UNKNOWN")
    message = cause.error_message if cause.kind == "died" else ""
    if "because its owner has died" in message:
        kind, summary = _DEATH_REASONS["OWNER_DIED"]
    elif reason == "WORKER_DIED" and "exit type: INTENDED_USER_EXIT" in message:
        kind, summary = "exited", "it exited on purpose (exit_actor / sys.exit)"
    elif reason in _DEATH_REASONS:
        kind, summary = _DEATH_REASONS[reason]
    elif not cause.recorded:
        kind, summary = "unknown", "Ray recorded no death cause"
    else:
        kind, summary = reason.lower(), reason.replace("_", " ").lower()
    return {"cause": kind, "summary": summary, "reason": reason, "message": message,
            "never_started": cause.never_started}


def short_name(task: RayTask) -> str:
    """The name a person knows a task by: its name, else its function, else its id's start."""
    return task.name or task.function or task.task_id[:12] or "?"


def seconds(ms: Any) -> float | None:
    """Milliseconds since the epoch as seconds, None when absent."""
    try:
        return float(ms) / 1000.0 if ms else None
    except (TypeError, ValueError):
        return None


def started_at(task: RayTask) -> float | None:
    """When a task started running (its start time, else its first running event)."""
    start = seconds(task.start_time_ms)
    if start is None:
        for entry in task.events:
            if entry.state in RUNNING_STATES:
                start = seconds(entry.created_ms)
                break
    return start
