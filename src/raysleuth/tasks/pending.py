"""Why each task, actor creation and placement group that has not started waits (:data:`REASONS`).

Reads records (:mod:`raysleuth.cluster.records`) already listed by
:func:`raysleuth.tasks.find.find_tasks`; lists placement groups, and object
references when something waits on arguments, through its ``listing``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from raysleuth import cluster
from raysleuth.cluster.records import RayActor, RayObject, RayPlacementGroup, RayTask
from raysleuth.tasks.classify import (
    PENDING_STATES,
    RUNNING_STATES,
    death_cause,
    fit_problem,
    pg_problem,
    seconds,
    short_name,
    started_at,
    upstream_task_id,
)
from raysleuth.tasks.model import REASONS, PendingTask

__all__ = ["PendingContext", "classify_pending", "find_pending"]

_ARGS_STATES = ("PENDING_ARGS_AVAIL", "PENDING_ARGS_FETCH", "PENDING_ACTOR_TASK_ARGS_FETCH")


@dataclasses.dataclass(kw_only=True)
class PendingContext:
    """What the cluster looks like around the waiting tasks (read once, shared by every classification)."""

    tasks: list[RayTask]
    actors_by_id: dict[str, RayActor]
    capacities: list[dict[str, float]]
    """Total resources of each alive node."""
    pgs: dict[str, RayPlacementGroup] = dataclasses.field(default_factory=dict)
    pg_problems: dict[str, str | None] = dataclasses.field(default_factory=dict)
    """Per pending placement group: why it can never be placed, or None when it only waits."""
    used_by_pending: list[RayObject] = dataclasses.field(default_factory=list)
    by_id: dict[str, RayTask] = dataclasses.field(default_factory=dict)
    running_by_actor: dict[str, list[RayTask]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_id = {task.task_id: task for task in self.tasks}
        running: dict[str, list[RayTask]] = defaultdict(list)
        for task in self.tasks:
            if task.actor_id and task.state in RUNNING_STATES and task.type == "ACTOR_TASK":
                running[task.actor_id].append(task)
        self.running_by_actor = dict(running)


def find_pending(tasks: list[RayTask], actors_by_id: dict[str, RayActor], capacities: list[dict[str, float]],
                 listing: Callable[..., list[Any]], now: float, older_than: float) -> list[PendingTask]:
    """Every pending placement group, task and actor creation, with why it waits."""
    context = PendingContext(tasks=tasks, actors_by_id=actors_by_id, capacities=capacities,
                             pgs={pg.placement_group_id: pg for pg in listing("placement_groups",
                                                                              cluster.placement_groups)})
    result = _placement_groups(context, now, older_than)
    waiting = [task for task in tasks if task.state in PENDING_STATES]
    if any(task.state in _ARGS_STATES for task in waiting):
        try:
            context.used_by_pending = listing("objects", cluster.objects, reference_type="USED_BY_PENDING_TASK")
        except Exception:
            context.used_by_pending = []
    seen_actors: set[str] = set()
    for task in waiting:
        entry = classify_pending(task, context)
        created = seconds(task.creation_time_ms)
        entry.waiting_s = now - created if created else None
        entry.problem = entry.reason == "infeasible" or (entry.waiting_s or 0) > older_than
        if task.type == "ACTOR_CREATION_TASK" and task.actor_id:
            seen_actors.add(task.actor_id)
        result.append(entry)
    for actor_id, actor in actors_by_id.items():  # actors whose creation task events were not (yet) reported
        if actor.state == "PENDING_CREATION" and actor_id not in seen_actors:
            required = actor.required_resources
            problem = fit_problem(required, capacities)
            result.append(PendingTask(
                task_id=actor_id, name=f"{actor.class_name}.__init__", state="PENDING_CREATION",
                type="ACTOR_CREATION_TASK", actor_id=actor_id, required_resources=required,
                reason="infeasible" if problem else "waiting_for_resources",
                detail=problem or "the actor waits to be placed", problem=bool(problem),
            ))
    return result


def _placement_groups(context: PendingContext, now: float, older_than: float) -> list[PendingTask]:
    """Pending placement groups (and ``context.pg_problems`` for the tasks that wait on them)."""
    result = []
    for pg_id, pg in context.pgs.items():
        if pg.state not in ("PENDING", "RESCHEDULING"):
            continue
        bundles = list(pg.bundles)
        problem = pg_problem(bundles, pg.strategy, context.capacities)
        if problem is None and pg.scheduling_state == "INFEASIBLE":
            problem = "Ray's scheduler reports it infeasible on the current nodes"
        context.pg_problems[pg_id] = problem
        waited = now - pg.created_ns / 1e9 if pg.created_ns else None
        total: dict[str, float] = {}
        for bundle in bundles:
            for key, value in bundle.items():
                total[key] = total.get(key, 0.0) + float(value)
        shape = ", ".join(f"{{{', '.join(f'{k}: {v:g}' for k, v in b.items())}}}" for b in bundles)
        result.append(PendingTask(
            task_id=pg_id, name=pg.name or f"placement group {pg_id[:8]}", state=pg.state,
            type="PLACEMENT_GROUP", placement_group_id=pg_id, required_resources=total,
            reason="infeasible" if problem else "waiting_for_resources",
            detail=(problem or "its bundles fit the cluster but the resources are busy")
            + f" (bundles [{shape}], strategy {pg.strategy or '?'})",
            waiting_s=waited, problem=bool(problem) or (waited or 0) > older_than,
        ))
    return result


def classify_pending(task: RayTask, context: PendingContext) -> PendingTask:
    """Why one task that has not started waits."""
    state = task.state or "NIL"
    entry = PendingTask(task_id=task.task_id, name=short_name(task), state=state, reason="unknown",
                        detail=REASONS["unknown"], type=task.type or "NORMAL_TASK",
                        required_resources=dict(task.required_resources), actor_id=task.actor_id,
                        placement_group_id=task.placement_group_id)
    for rule in (_dead_actor, _dependencies, _object_store, _actor_queue, _placement_group, _resources):
        if rule(task, state, entry, context):
            return entry
    if state == "SUBMITTED_TO_WORKER":
        entry.reason = "starting_worker"
        entry.detail = REASONS["starting_worker"]
    return entry


def _dead_actor(task: RayTask, state: str, entry: PendingTask, context: PendingContext) -> bool:
    if task.type != "ACTOR_TASK":
        return False
    actor = context.actors_by_id.get(task.actor_id or "")
    if actor is None or not actor.state or actor.state == "ALIVE":
        return False
    entry.reason = "waiting_for_actor"
    cause = death_cause(actor)["summary"] if actor.state == "DEAD" else None
    entry.detail = f"actor {actor.class_name} {actor.name or ''} is {actor.state}".replace("  ", " ")
    if cause:
        entry.detail += f": {cause}"
    return True


def _dependencies(task: RayTask, state: str, entry: PendingTask, context: PendingContext) -> bool:
    if state not in _ARGS_STATES:
        return False
    entry.reason = "waiting_for_dependencies"
    entry.upstream = _upstream(task, context)
    if entry.upstream:
        described = [f"{up['name']} ({up['task_id'][:12]}…, {up['state']})" for up in entry.upstream[:3]]
        more = f" and {len(entry.upstream) - 3} more" if len(entry.upstream) > 3 else ""
        entry.detail = "waits for the result of " + ", ".join(described) + more
    elif state in ("PENDING_ARGS_FETCH", "PENDING_ACTOR_TASK_ARGS_FETCH"):
        entry.detail = "its arguments are ready and being fetched to the node (large objects, or a slow link)"
    else:
        entry.detail = "an argument is not ready; its producing task was not found in the task listing"
    return True


def _object_store(task: RayTask, state: str, entry: PendingTask, context: PendingContext) -> bool:
    if state != "PENDING_OBJ_STORE_MEM_AVAIL":
        return False
    entry.reason = "object_store"
    entry.detail = "the node's object store is full; the task waits for memory to free (`ray memory` shows holders)"
    return True


def _actor_queue(task: RayTask, state: str, entry: PendingTask, context: PendingContext) -> bool:
    if task.type != "ACTOR_TASK":
        return False
    running = context.running_by_actor.get(task.actor_id or "", [])
    if state in ("PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY", "SUBMITTED_TO_WORKER") and running:
        entry.reason = "queued_behind_actor_calls"
        now = time.time()
        names = [f"{short_name(call)} (running {now - (started_at(call) or now):.0f}s)" for call in running[:3]]
        entry.detail = (f"the actor runs {len(running)} call(s) now (its max_concurrency is reached): "
                        + ", ".join(names))
    elif state == "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY":
        entry.reason = "queued_behind_actor_calls"
        entry.detail = "waits for earlier calls from the same caller (actor calls run in submission order)"
    else:
        entry.reason = "starting_worker" if state == "SUBMITTED_TO_WORKER" else "unknown"
        entry.detail = REASONS[entry.reason]
    return True


def _placement_group(task: RayTask, state: str, entry: PendingTask, context: PendingContext) -> bool:
    pg_id = task.placement_group_id
    if not pg_id or pg_id not in context.pg_problems:
        return False
    entry.reason = "placement_group_pending"
    problem = context.pg_problems[pg_id]
    entry.detail = (f"placement group {pg_id[:8]} is {context.pgs[pg_id].state}"
                    + (f" and infeasible: {problem}" if problem else " (its bundles wait for resources)"))
    return True


def _resources(task: RayTask, state: str, entry: PendingTask, context: PendingContext) -> bool:
    if state not in ("PENDING_NODE_ASSIGNMENT", "NIL"):
        return False
    required = entry.required_resources
    problem = fit_problem(required, context.capacities)
    if problem:
        entry.reason = "infeasible"
        entry.detail = problem
    else:
        entry.reason = "waiting_for_resources"
        asked = ", ".join(f"{key}: {value:g}" for key, value in required.items()) or "nothing"
        entry.detail = f"asks {asked}; {_holders(required, context)}"
    return True


def _upstream(task: RayTask, context: PendingContext) -> list[dict[str, Any]]:
    """Unfinished tasks whose results pending tasks of the same caller wait for."""
    found: dict[str, dict[str, Any]] = {}
    created = task.creation_time_ms or 0
    for obj in context.used_by_pending:
        producer_id = upstream_task_id(obj.object_id)
        if producer_id == task.task_id or producer_id in found:
            continue
        producer = context.by_id.get(producer_id)
        if producer is None or producer.state == "FINISHED":
            continue
        if producer.parent_task_id != task.parent_task_id:
            continue  # another caller's object
        if (producer.creation_time_ms or 0) > created:
            continue  # submitted after this task: cannot be its argument
        found[producer_id] = {"task_id": producer_id, "name": short_name(producer), "state": producer.state,
                              "object_id": obj.object_id}
    return list(found.values())


def _holders(resources: dict[str, float], context: PendingContext) -> str:
    """Who holds the resources a task asks for: running tasks and alive actors, biggest first."""
    wanted = [key for key in resources if not key.startswith("node:")]
    counts: dict[tuple[str, str], list[float]] = defaultdict(list)
    for task in context.tasks:
        if task.state in RUNNING_STATES and task.type == "NORMAL_TASK":
            for key in wanted:
                amount = task.required_resources.get(key)
                if amount:
                    counts[(key, task.function or "?")].append(float(amount))
    for actor in context.actors_by_id.values():
        if actor.state == "ALIVE":
            for key in wanted:
                amount = actor.required_resources.get(key)
                if amount:
                    counts[(key, f"actor {actor.class_name}")].append(float(amount))
    if not counts:
        return "no running task or actor holds them (other jobs, or resources freeing up)"
    ranked = sorted(counts.items(), key=lambda item: -sum(item[1]))[:4]
    return "held by " + ", ".join(f"{name} ×{len(values)} ({key} {sum(values):g})" for (key, name), values in ranked)
