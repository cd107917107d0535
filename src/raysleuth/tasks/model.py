"""What task forensics reports: the dataclasses of :class:`TaskReport` (JSON through ``to_dict``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth.deaths import Death

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


DeadActor = Death
"""A dead actor is a :class:`raysleuth.deaths.Death` (one form for every dead worker; this name stays public)."""


@dataclasses.dataclass(kw_only=True)
class TaskReport:
    """What :func:`find_tasks` found."""

    pending: list[PendingTask] = dataclasses.field(default_factory=list)
    stuck: list[StuckTask] = dataclasses.field(default_factory=list)
    failed: list[FailedTask] = dataclasses.field(default_factory=list)
    deaths: list[Death] = dataclasses.field(default_factory=list)
    """Every dead actor and task worker with rank, classified cause, evidence and context; Ray's own reason
    alone (classified) when the forensics could not run."""
    truncated: bool = False
    truncated_listings: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    older_than_s: float = 60.0
    time: float = 0.0

    @property
    def problem(self) -> bool:
        """Anything pending past the threshold (or infeasible), stuck, failed or dead."""
        return bool(any(item.problem for item in self.pending) or self.stuck or self.failed or self.deaths)

    @property
    def dead_actors(self) -> list[Death]:
        """The deaths that were actors (``deaths`` holds task workers too)."""
        return [death for death in self.deaths if death.actor_id]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        result = dataclasses.asdict(self)
        result["problem"] = self.problem
        result["dead_actors"] = [death.to_dict() for death in self.dead_actors]
        return result
