"""What task forensics reports: the dataclasses of :class:`TaskReport` (JSON through ``to_dict``)."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["DeadActor", "FailedTask", "PendingTask", "REASONS", "StuckTask", "TaskReport"]

#: Why a task waits, and what each reason means.
REASONS = {
    "infeasible": "no alive node could ever fit its resources",
    "waiting_for_resources": "it fits, but the resources are busy",
    "placement_group_pending": "its placement group is not created yet",
    "waiting_for_dependencies": "an argument (an upstream task's result) is not ready",
    "waiting_for_actor": "its actor is not alive (pending creation, restarting, dead)",
    "queued_behind_actor_calls": "its actor is busy with earlier calls",
    "object_store": "waiting for object store memory",
    "starting_worker": "handed to a worker that has not started it yet",
    "unknown": "no reason could be derived from its state",
}


@dataclasses.dataclass(kw_only=True)
class PendingTask:
    """A task, actor creation or placement group that has not started, and why."""

    task_id: str
    name: str
    state: str
    reason: str
    detail: str
    type: str = "NORMAL_TASK"
    required_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    waiting_s: float | None = None
    actor_id: str | None = None
    placement_group_id: str | None = None
    upstream: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    problem: bool = False
    """Infeasible, or waiting longer than the threshold."""


@dataclasses.dataclass(kw_only=True)
class StuckTask:
    """A running call far slower than its peers of the same function."""

    task_id: str
    name: str
    state: str
    running_s: float
    peer_median_s: float
    peers: int
    ratio: float
    node_id: str | None = None
    node_ip: str | None = None
    pid: int | None = None
    rank: int | None = None
    actor_id: str | None = None
    stack: Any = None


@dataclasses.dataclass(kw_only=True)
class FailedTask:
    """A failed task with its error and, when known, cause and fix."""

    task_id: str
    name: str
    error_type: str | None
    error_message: str
    node_id: str | None = None
    pid: int | None = None
    rank: int | None = None
    actor_id: str | None = None
    cause: str | None = None
    fix: str | None = None
    time: float | None = None


@dataclasses.dataclass(kw_only=True)
class DeadActor:
    """A dead actor, its death cause and its rank."""

    actor_id: str
    class_name: str
    name: str | None
    rank: int | None
    death_cause: str
    summary: str
    message: str
    node_id: str | None = None
    node_ip: str | None = None
    pid: int | None = None
    num_restarts: int = 0
    fix: str | None = None
    rank_source: str | None = None
    cause: str | None = None
    """The classified cause (:data:`raysleuth.deaths.CAUSES`); ``death_cause`` stays Ray's own reason."""
    evidence: list[str] = dataclasses.field(default_factory=list)
    """What decided ``cause`` (:mod:`raysleuth.deaths`)."""


@dataclasses.dataclass(kw_only=True)
class TaskReport:
    """What :func:`find_tasks` found."""

    pending: list[PendingTask] = dataclasses.field(default_factory=list)
    stuck: list[StuckTask] = dataclasses.field(default_factory=list)
    failed: list[FailedTask] = dataclasses.field(default_factory=list)
    dead_actors: list[DeadActor] = dataclasses.field(default_factory=list)
    deaths: list[Any] = dataclasses.field(default_factory=list)
    """Every dead actor and task worker with rank, classified cause, evidence and context
    (:class:`raysleuth.deaths.Death`)."""
    truncated: bool = False
    truncated_listings: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    older_than_s: float = 60.0
    time: float = 0.0

    @property
    def problem(self) -> bool:
        """Anything pending past the threshold (or infeasible), stuck, failed or dead."""
        return bool(any(item.problem for item in self.pending) or self.stuck or self.failed or self.dead_actors
                    or self.deaths)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        result = dataclasses.asdict(self)
        result["problem"] = self.problem
        return result
