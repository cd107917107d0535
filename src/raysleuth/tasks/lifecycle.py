"""One task's life: each state it passed through, when, for how long, where, and each retry.

:func:`trace_ray_task` accepts an ``ObjectRef`` (a task's or an actor
call's result), a task id, or an object id, and reads the task events of
every attempt from the State API. Task events reach the State API a second
or so after they happen; ``wait_s`` polls that long for a task not yet seen.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Sequence
from typing import Any

from raysleuth import cluster
from raysleuth.cluster.records import RayTaskEvent
from raysleuth.errors import UsageError

__all__ = ["LifecyclePhase", "TaskAttempt", "TaskTrace", "complete_task_id", "phases_from_events", "task_id_of",
           "trace_ray_task"]

#: What each task state means, in words.
STATE_LABELS = {
    "NIL": "created",
    "PENDING_ARGS_AVAIL": "waiting for arguments",
    "PENDING_NODE_ASSIGNMENT": "waiting for a node (resources)",
    "PENDING_OBJ_STORE_MEM_AVAIL": "waiting for object store memory",
    "PENDING_ARGS_FETCH": "fetching arguments to the node",
    "SUBMITTED_TO_WORKER": "submitted to a worker",
    "PENDING_ACTOR_TASK_ARGS_FETCH": "fetching arguments to the actor",
    "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY": "queued on the actor",
    "RUNNING": "running",
    "RUNNING_IN_RAY_GET": "running, blocked in ray.get",
    "RUNNING_IN_RAY_WAIT": "running, blocked in ray.wait",
    "FINISHED": "finished",
    "FAILED": "failed",
}
_TERMINAL = {"FINISHED", "FAILED"}
_HEX = re.compile(r"^[0-9a-f]+$")


@dataclasses.dataclass(kw_only=True)
class LifecyclePhase:
    """One state of one attempt: from ``start`` to ``end`` (``None`` while it lasts)."""

    state: str
    label: str
    start: float
    end: float | None
    duration_s: float


@dataclasses.dataclass(kw_only=True)
class TaskAttempt:
    """One attempt (the first run, or a retry) of a task."""

    attempt_number: int
    state: str
    node_id: str | None
    worker_id: str | None
    worker_pid: int | None
    phases: list[LifecyclePhase]
    error_type: str | None = None
    error_message: str | None = None
    profile: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Ray's profile events of the attempt (deserialize args, execute, store outputs) when recorded."""


@dataclasses.dataclass(kw_only=True)
class TaskTrace:
    """The lifecycle of one task across its attempts."""

    task_id: str
    name: str
    function: str | None
    type: str | None
    state: str
    job_id: str | None
    actor_id: str | None
    attempts: list[TaskAttempt]
    retries: int
    total_s: float | None
    """Creation of the first attempt to the end of the last (or now)."""
    waiting_s: float
    """Time in states before running, over all attempts."""
    running_s: float
    required_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    placement_group_id: str | None = None
    node_ip: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)


def task_id_of(ref_or_task_id: Any) -> str:
    """The task id (hex) of an ObjectRef, an actor-call ref, a task id or an object id."""
    task_id = getattr(ref_or_task_id, "task_id", None)
    if callable(task_id):
        return task_id().hex()
    if isinstance(ref_or_task_id, bytes):
        ref_or_task_id = ref_or_task_id.hex()
    if not isinstance(ref_or_task_id, str):
        raise UsageError(f"cannot trace {type(ref_or_task_id).__name__} {ref_or_task_id!r}",
                         fix="pass an ObjectRef returned by .remote(), or a task id (hex, from `raysleuth tasks`)")
    text = ref_or_task_id.strip().lower()
    if not _HEX.match(text) or not (MIN_PREFIX <= len(text) <= 48 or len(text) == 56):
        raise UsageError(f"{ref_or_task_id!r} is not a Ray task id",
                         fix=f"give a task id (48 hex characters), a unique prefix of one (at least {MIN_PREFIX}, as "
                             "`raysleuth tasks` prints) or an object id (56); see `raysleuth tasks`")
    return text[:48]


#: The shortest task id prefix ``trace`` accepts (``raysleuth tasks`` prints 16).
MIN_PREFIX = 6


def complete_task_id(prefix: str, task_ids) -> str:
    """The one task id in ``task_ids`` that starts with ``prefix``, as git does with commits (pure).

    Raises :class:`UsageError` naming the candidates when several match, and when none does.
    """
    if len(prefix) >= 48:
        return prefix[:48]
    found = sorted({task_id for task_id in task_ids if task_id and task_id.startswith(prefix)})
    if len(found) == 1:
        return found[0]
    if not found:
        raise UsageError(f"no task id starts with {prefix!r} in Ray's task events",
                         fix="copy the id from `raysleuth tasks` (events arrive about a second late; old tasks are "
                             "evicted past RAY_task_events_max_num_task_in_gcs)")
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    raise UsageError(f"task id prefix {prefix!r} is ambiguous: {len(found)} tasks match ({shown})",
                     fix="give more characters of the id")


def _listed_ids(prefix: str) -> list[str]:
    """Task ids to complete ``prefix`` against. A busy cluster's listing stops at the State API's limit
    before it reaches every task; the ones ``raysleuth tasks`` prints (not finished: pending, running,
    failed) are then listed again, filtered by the GCS before that limit."""
    listing = cluster.tasks(detail=False)
    ids = [task.task_id for task in listing]
    if listing.truncated and not any(task_id.startswith(prefix) for task_id in ids):
        ids += [task.task_id for task in cluster.tasks(detail=False, not_states=("FINISHED",))]
    return ids


def _full_task_id(task_id: str, deadline: float) -> str:
    """A prefix completed against the cluster's task listing (polled until ``deadline`` for late events)."""
    while True:
        listing = _listed_ids(task_id)
        try:
            return complete_task_id(task_id, listing)
        except UsageError:
            if time.monotonic() >= deadline or any(listed.startswith(task_id) for listed in listing):
                raise
        time.sleep(0.3)


def phases_from_events(events: Sequence[RayTaskEvent], now: float | None = None) -> list[LifecyclePhase]:
    """Turn a task's state changes into phases with durations (pure)."""
    now = time.time() if now is None else now
    ordered = sorted((entry for entry in events if entry.created_ms), key=lambda entry: entry.created_ms or 0)
    phases = []
    for index, entry in enumerate(ordered):
        start = float(entry.created_ms or 0) / 1000.0
        state = entry.state or "NIL"
        if state in _TERMINAL:
            end: float | None = start
        elif index + 1 < len(ordered):
            end = float(ordered[index + 1].created_ms or 0) / 1000.0
        else:
            end = None
        phases.append(LifecyclePhase(state=state, label=STATE_LABELS.get(state, state.lower()), start=start,
                                     end=end, duration_s=max(0.0, (end if end is not None else now) - start)))
    return phases


def trace_ray_task(ref_or_task_id: Any, address: str | None = None, *, wait_s: float = 5.0) -> TaskTrace:
    """The lifecycle of one task from the State API: every state with its time and duration.

    Accepts an ``ObjectRef`` (task or actor call), a task id or an object id.
    Polls up to ``wait_s`` for a task whose events have not arrived yet.
    Raises :class:`~raysleuth.errors.UsageError` when no such task exists.
    """
    task_id = task_id_of(ref_or_task_id)
    cluster.connect(address)
    deadline = time.monotonic() + max(0.0, wait_s)
    if len(task_id) < 48:
        task_id = _full_task_id(task_id, deadline)
    records = cluster.get_task(task_id)
    while not records and time.monotonic() < deadline:
        time.sleep(0.3)
        records = cluster.get_task(task_id)
    if not records:
        raise UsageError(f"no task {task_id} in Ray's task events",
                         fix="check the id (`raysleuth tasks`); events arrive about a second late, and old tasks "
                             "are evicted past RAY_task_events_max_num_task_in_gcs")
    now = time.time()
    attempts = []
    waiting = running = 0.0
    for record in records:
        phases = phases_from_events(record.events, now)
        for phase in phases:
            if phase.state.startswith("RUNNING"):
                running += phase.duration_s
            elif phase.state not in _TERMINAL:
                waiting += phase.duration_s
        attempts.append(TaskAttempt(
            attempt_number=record.attempt_number, state=record.state or "NIL", node_id=record.node_id,
            worker_id=record.worker_id, worker_pid=record.worker_pid, phases=phases, error_type=record.error_type,
            error_message=record.error_message, profile=[dict(event) for event in record.profile_events],
        ))
    last = records[-1]
    first_start = min((phase.start for attempt in attempts for phase in attempt.phases), default=None)
    ends = [attempt.phases[-1].end for attempt in attempts if attempt.phases]
    last_end = ends[-1] if ends and ends[-1] is not None else now
    node_ip = None
    if last.node_id:
        node_ip = next((node.node_ip for node in cluster.nodes() if node.node_id == last.node_id), None)
    return TaskTrace(
        task_id=task_id, name=last.name or task_id[:12], function=last.function,
        type=last.type, state=last.state or "NIL", job_id=last.job_id,
        actor_id=last.actor_id, attempts=attempts, retries=max(0, len(attempts) - 1),
        total_s=(last_end - first_start) if first_start is not None else None, waiting_s=waiting, running_s=running,
        required_resources=dict(last.required_resources), placement_group_id=last.placement_group_id,
        node_ip=node_ip,
    )
