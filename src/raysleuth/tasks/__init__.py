"""Task forensics: why each task waits, which calls are stuck, what failed, which actors died.

:func:`find_tasks` reads the State API once (tasks, actors, placement
groups, nodes, and object references when something waits on arguments)
and returns a :class:`TaskReport`:

- ``pending`` — every task, actor creation and placement group that has not
  started, with *why it waits* (:data:`REASONS`) and for how long;
- ``stuck`` — running calls far slower than their peers of the same function
  (robust statistics, :func:`raysleuth.tasks.classify.is_stuck`);
- ``failed`` — failed tasks with the error type and, when ``raysleuth.explain``
  knows it, a cause and fix;
- ``dead_actors`` — with the death cause Ray recorded and the rank.

A listing cut at the State API's limit sets ``truncated`` and says which one.
:func:`trace_ray_task` (in :mod:`raysleuth.tasks.lifecycle`) is one task's life.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Any

from raysleuth import cluster
from raysleuth.redaction import redact_text
from raysleuth.tasks.classify import (
    PENDING_STATES,
    RUNNING_STATES,
    death_cause,
    fit_problem,
    is_stuck,
    pg_problem,
    upstream_task_id,
)
from raysleuth.tasks.lifecycle import LifecyclePhase, TaskAttempt, TaskTrace, trace_ray_task

__all__ = [
    "DeadActor",
    "FailedTask",
    "LifecyclePhase",
    "PendingTask",
    "REASONS",
    "StuckTask",
    "TaskAttempt",
    "TaskReport",
    "TaskTrace",
    "find_tasks",
    "trace_ray_task",
]

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


# ------------------------------------------------------------------ helpers


def _seconds(ms: Any) -> float | None:
    try:
        return float(ms) / 1000.0 if ms else None
    except (TypeError, ValueError):
        return None


def _short(task: dict[str, Any]) -> str:
    return task.get("name") or task.get("func_or_class_name") or task.get("task_id", "?")[:12]


def _started(task: dict[str, Any]) -> float | None:
    start = _seconds(task.get("start_time_ms"))
    if start is None:
        for entry in task.get("events") or []:
            if entry.get("state") in RUNNING_STATES:
                start = _seconds(entry.get("created_ms"))
                break
    return start


def _holders(resources: dict[str, float], tasks: list[dict], actors: list[dict]) -> str:
    """Who holds the resources a task asks for: running tasks and alive actors, biggest first."""
    wanted = [key for key in resources if not key.startswith("node:")]
    counts: dict[tuple[str, str], list[float]] = defaultdict(list)
    for task in tasks:
        if task.get("state") in RUNNING_STATES and task.get("type") == "NORMAL_TASK":
            for key in wanted:
                amount = (task.get("required_resources") or {}).get(key)
                if amount:
                    counts[(key, task.get("func_or_class_name") or "?")].append(float(amount))
    for actor in actors:
        if actor.get("state") == "ALIVE":
            for key in wanted:
                amount = (actor.get("required_resources") or {}).get(key)
                if amount:
                    counts[(key, f"actor {actor.get('class_name')}")].append(float(amount))
    if not counts:
        return "no running task or actor holds them (other jobs, or resources freeing up)"
    ranked = sorted(counts.items(), key=lambda item: -sum(item[1]))[:4]
    return "held by " + ", ".join(f"{name} ×{len(values)} ({key} {sum(values):g})" for (key, name), values in ranked)


# --------------------------------------------------------------------- main


def find_tasks(
    address: str | None = None,
    *,
    pending: bool = True,
    stuck: bool = True,
    failed: bool = True,
    dead: bool = True,
    older_than: float = 60.0,
    stuck_factor: float = 5.0,
    stuck_floor_s: float = 10.0,
    job_id: str | None = None,
    stack: bool = False,
    explain: bool = True,
) -> TaskReport:
    """Read the cluster's tasks and actors once and explain what waits, hangs, failed or died.

    ``older_than``: a pending task waiting longer is a problem (infeasible
    ones always are). ``stuck_factor``/``stuck_floor_s``: a running call is
    stuck past ``factor`` × its peers' median and past the floor.
    ``job_id`` limits to one job. ``stack`` adds py-spy stacks of stuck
    workers (needs :mod:`raysleuth.stacks`).
    """
    cluster.connect(address)
    now = time.time()
    report = TaskReport(older_than_s=older_than, time=now)
    listings: dict[str, cluster.Listing] = {}

    def listing(name: str, function, **kwargs) -> list[dict[str, Any]]:
        if name not in listings:
            listings[name] = function(**kwargs)
            if listings[name].truncated:
                report.truncated = True
                report.truncated_listings.append(name)
                report.warnings.append(f"the State API returned only the first {len(listings[name])} {name}; "
                                       "the rest were not examined")
        return listings[name].items

    tasks = listing("tasks", cluster.tasks)
    if job_id:
        tasks = [task for task in tasks if task.get("job_id") == job_id]
    actors = listing("actors", cluster.actors)
    # raysleuth's own actors (writer, agents: namespace "raysleuth") are never the user's problem
    ours = {actor.get("actor_id") for actor in actors if _is_raysleuth(actor)}
    actors = [actor for actor in actors if actor.get("actor_id") not in ours]
    tasks = [task for task in tasks if task.get("actor_id") not in ours and not _is_raysleuth(task)]
    actors_by_id = {actor.get("actor_id"): actor for actor in actors}
    nodes = cluster.nodes(alive_only=True)
    node_ips = {node["node_id"]: node["node_ip"] for node in cluster.nodes()}
    capacities = [node["resources_total"] for node in nodes]
    labels: dict | None = None

    def rank_of(node_id: str | None, pid: int | None, actor_name: str | None = None) -> int | None:
        nonlocal labels
        rank = cluster.rank_from_name(actor_name)
        if rank is not None:
            return rank
        if labels is None:
            try:
                from raysleuth.labels.live import registered_labels

                labels = registered_labels()
            except Exception:
                labels = {}
        entry = labels.get((node_ips.get(node_id), pid)) if pid else None
        return entry.get("rank") if entry else None

    if pending:
        report.pending = _pending(tasks, actors_by_id, capacities, listing, now, older_than)
    if stuck:
        report.stuck = _stuck(tasks, now, stuck_factor, stuck_floor_s, node_ips, actors_by_id, rank_of)
        if stack and report.stuck:
            _attach_stacks(report)
    if failed:
        report.failed = _failed(tasks, actors_by_id, rank_of, explain)
    if dead:
        report.dead_actors = _dead(actors, node_ips, rank_of, explain, job_id)
        _classify_deaths(report, job_id)
    return report


def _classify_deaths(report: TaskReport, job_id: str | None) -> None:
    """Replace Ray's generic death reasons by the classified cause, rank and evidence (raysleuth.deaths)."""
    try:
        from raysleuth.deaths import find_deaths

        found = find_deaths(job_id=job_id)
    except Exception as error:
        report.warnings.append(f"death forensics failed, showing Ray's own reasons: {type(error).__name__}: {error}")
        return
    report.deaths = found.deaths
    report.warnings += found.warnings
    by_actor = {death.actor_id: death for death in found.deaths if death.actor_id}
    for item in report.dead_actors:
        death = by_actor.get(item.actor_id)
        if death is None:
            continue
        item.cause, item.summary, item.evidence = death.cause, death.summary, death.evidence
        item.fix = death.fix or item.fix
        if death.rank is not None:
            item.rank, item.rank_source = death.rank, death.rank_source


def _pending(tasks, actors_by_id, capacities, listing, now, older_than) -> list[PendingTask]:
    result: list[PendingTask] = []
    pgs = {pg.get("placement_group_id"): pg for pg in listing("placement_groups", cluster.placement_groups)}
    by_id = {task.get("task_id"): task for task in tasks}
    running_by_actor: dict[str, list[dict]] = defaultdict(list)
    for task in tasks:
        if task.get("actor_id") and task.get("state") in RUNNING_STATES and task.get("type") == "ACTOR_TASK":
            running_by_actor[task["actor_id"]].append(task)
    waiting = [task for task in tasks if task.get("state") in PENDING_STATES]
    needs_objects = any(task.get("state") in ("PENDING_ARGS_AVAIL", "PENDING_ARGS_FETCH",
                                              "PENDING_ACTOR_TASK_ARGS_FETCH") for task in waiting)
    used_by_pending: list[dict] = []
    if needs_objects:
        try:
            used_by_pending = listing("objects", cluster.objects, reference_type="USED_BY_PENDING_TASK")
        except Exception:
            used_by_pending = []
    pg_problems: dict[str, str | None] = {}
    for pg_id, pg in pgs.items():
        if pg.get("state") in ("PENDING", "RESCHEDULING"):
            bundles = [bundle.get("unit_resources") or {} for bundle in pg.get("bundles") or []]
            problem = pg_problem(bundles, pg.get("strategy"), capacities)
            stats = pg.get("stats") or {}
            if problem is None and stats.get("scheduling_state") == "INFEASIBLE":
                problem = "Ray's scheduler reports it infeasible on the current nodes"
            pg_problems[pg_id] = problem
            created = stats.get("creation_request_received_ns")
            waited = now - int(created) / 1e9 if created else None
            total: dict[str, float] = {}
            for bundle in bundles:
                for key, value in bundle.items():
                    total[key] = total.get(key, 0.0) + float(value)
            shape = ", ".join(f"{{{', '.join(f'{k}: {v:g}' for k, v in b.items())}}}" for b in bundles)
            strategy = pg.get("strategy") or "?"
            result.append(PendingTask(
                task_id=pg_id, name=pg.get("name") or f"placement group {pg_id[:8]}", state=pg.get("state"),
                type="PLACEMENT_GROUP", placement_group_id=pg_id, required_resources=total,
                reason="infeasible" if problem else "waiting_for_resources",
                detail=(problem or "its bundles fit the cluster but the resources are busy")
                + f" (bundles [{shape}], strategy {strategy})",
                waiting_s=waited, problem=bool(problem) or (waited or 0) > older_than,
            ))
    seen_actors: set[str] = set()
    for task in waiting:
        entry = _classify(task, by_id, actors_by_id, running_by_actor, used_by_pending, pgs, pg_problems,
                          capacities, tasks)
        created = _seconds(task.get("creation_time_ms"))
        entry.waiting_s = now - created if created else None
        entry.problem = entry.reason == "infeasible" or (entry.waiting_s or 0) > older_than
        if task.get("type") == "ACTOR_CREATION_TASK" and task.get("actor_id"):
            seen_actors.add(task["actor_id"])
        result.append(entry)
    for actor_id, actor in actors_by_id.items():  # actors whose creation task events were not (yet) reported
        if actor.get("state") == "PENDING_CREATION" and actor_id not in seen_actors:
            required = actor.get("required_resources") or {}
            problem = fit_problem(required, capacities)
            result.append(PendingTask(
                task_id=actor_id, name=f"{actor.get('class_name')}.__init__", state="PENDING_CREATION",
                type="ACTOR_CREATION_TASK", actor_id=actor_id, required_resources=required,
                reason="infeasible" if problem else "waiting_for_resources",
                detail=problem or "the actor waits to be placed", problem=bool(problem),
            ))
    return result


def _classify(task, by_id, actors_by_id, running_by_actor, used_by_pending, pgs, pg_problems, capacities,
              tasks) -> PendingTask:
    state = task.get("state") or "NIL"
    required = {key: float(value) for key, value in (task.get("required_resources") or {}).items()}
    entry = PendingTask(task_id=task.get("task_id", ""), name=_short(task), state=state, reason="unknown",
                        detail=REASONS["unknown"], type=task.get("type") or "NORMAL_TASK",
                        required_resources=required, actor_id=task.get("actor_id"),
                        placement_group_id=task.get("placement_group_id") or None)

    if task.get("type") == "ACTOR_TASK":
        actor = actors_by_id.get(task.get("actor_id")) or {}
        actor_state = actor.get("state")
        if actor_state and actor_state != "ALIVE":
            entry.reason = "waiting_for_actor"
            cause = death_cause(actor)["summary"] if actor_state == "DEAD" else None
            entry.detail = f"actor {actor.get('class_name')} {actor.get('name') or ''} is {actor_state}".replace("  ", " ")
            if cause:
                entry.detail += f": {cause}"
            return entry
    if state in ("PENDING_ARGS_AVAIL", "PENDING_ARGS_FETCH", "PENDING_ACTOR_TASK_ARGS_FETCH"):
        entry.reason = "waiting_for_dependencies"
        entry.upstream = _upstream(task, by_id, used_by_pending)
        if entry.upstream:
            described = [f"{up['name']} ({up['task_id'][:12]}…, {up['state']})" for up in entry.upstream[:3]]
            more = f" and {len(entry.upstream) - 3} more" if len(entry.upstream) > 3 else ""
            entry.detail = "waits for the result of " + ", ".join(described) + more
        elif state == "PENDING_ARGS_FETCH" or state == "PENDING_ACTOR_TASK_ARGS_FETCH":
            entry.detail = "its arguments are ready and being fetched to the node (large objects, or a slow link)"
        else:
            entry.detail = "an argument is not ready; its producing task was not found in the task listing"
        return entry
    if state == "PENDING_OBJ_STORE_MEM_AVAIL":
        entry.reason = "object_store"
        entry.detail = "the node's object store is full; the task waits for memory to free (`ray memory` shows holders)"
        return entry
    if task.get("type") == "ACTOR_TASK":
        running = running_by_actor.get(task.get("actor_id"), [])
        if state in ("PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY", "SUBMITTED_TO_WORKER") and running:
            entry.reason = "queued_behind_actor_calls"
            now = time.time()
            names = [f"{_short(call)} (running {now - (_started(call) or now):.0f}s)" for call in running[:3]]
            entry.detail = (f"the actor runs {len(running)} call(s) now (its max_concurrency is reached): "
                            + ", ".join(names))
            return entry
        if state == "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY":
            entry.reason = "queued_behind_actor_calls"
            entry.detail = "waits for earlier calls from the same caller (actor calls run in submission order)"
            return entry
        entry.reason = "starting_worker" if state == "SUBMITTED_TO_WORKER" else "unknown"
        entry.detail = REASONS[entry.reason]
        return entry
    pg_id = task.get("placement_group_id")
    if pg_id and pg_id in pg_problems:
        entry.reason = "placement_group_pending"
        problem = pg_problems[pg_id]
        entry.detail = (f"placement group {pg_id[:8]} is {pgs[pg_id].get('state')}"
                        + (f" and infeasible: {problem}" if problem else " (its bundles wait for resources)"))
        return entry
    if state in ("PENDING_NODE_ASSIGNMENT", "NIL"):
        problem = fit_problem(required, capacities)
        if problem:
            entry.reason = "infeasible"
            entry.detail = problem
        else:
            entry.reason = "waiting_for_resources"
            asked = ", ".join(f"{key}: {value:g}" for key, value in required.items()) or "nothing"
            entry.detail = f"asks {asked}; {_holders(required, tasks, list(actors_by_id.values()))}"
        return entry
    if state == "SUBMITTED_TO_WORKER":
        entry.reason = "starting_worker"
        entry.detail = REASONS["starting_worker"]
    return entry


def _upstream(task, by_id, used_by_pending) -> list[dict[str, Any]]:
    """Unfinished tasks whose results pending tasks of the same caller wait for."""
    found: dict[str, dict[str, Any]] = {}
    created = task.get("creation_time_ms") or 0
    for obj in used_by_pending:
        producer_id = upstream_task_id(obj.get("object_id", ""))
        if producer_id == task.get("task_id") or producer_id in found:
            continue
        producer = by_id.get(producer_id)
        if producer is None:
            continue
        if producer.get("state") == "FINISHED":
            continue
        if producer.get("parent_task_id") != task.get("parent_task_id"):
            continue  # another caller's object
        if (producer.get("creation_time_ms") or 0) > created:
            continue  # submitted after this task: cannot be its argument
        found[producer_id] = {"task_id": producer_id, "name": _short(producer), "state": producer.get("state"),
                              "object_id": obj.get("object_id")}
    return list(found.values())


def _stuck(tasks, now, factor, floor_s, node_ips, actors_by_id, rank_of) -> list[StuckTask]:
    durations: dict[str, list[tuple[str, float]]] = defaultdict(list)
    running: list[tuple[dict, float]] = []
    for task in tasks:
        function = task.get("func_or_class_name") or task.get("name")
        start = _started(task)
        if start is None:
            continue
        if task.get("state") == "FINISHED":
            end = _seconds(task.get("end_time_ms"))
            if end is not None:
                durations[function].append((task.get("task_id"), max(0.0, end - start)))
        elif task.get("state") in RUNNING_STATES:
            elapsed = max(0.0, now - start)
            durations[function].append((task.get("task_id"), elapsed))
            running.append((task, elapsed))
    result = []
    for task, elapsed in running:
        function = task.get("func_or_class_name") or task.get("name")
        peers = [value for task_id, value in durations[function] if task_id != task.get("task_id")]
        stuck, median = is_stuck(elapsed, peers, factor=factor, floor_s=floor_s)
        if not stuck or median is None:
            continue
        actor = actors_by_id.get(task.get("actor_id")) or {}
        pid = task.get("worker_pid") or actor.get("pid")
        result.append(StuckTask(
            task_id=task.get("task_id"), name=_short(task), state=task.get("state"), running_s=elapsed,
            peer_median_s=median, peers=len(peers), ratio=elapsed / median if median > 0 else float("inf"),
            node_id=task.get("node_id"), node_ip=node_ips.get(task.get("node_id")), pid=pid,
            rank=rank_of(task.get("node_id"), pid, actor.get("name")), actor_id=task.get("actor_id"),
        ))
    result.sort(key=lambda item: -item.ratio)
    return result


def _attach_stacks(report: TaskReport) -> None:
    from raysleuth.stacks import dump_stacks

    pids = sorted({item.pid for item in report.stuck if item.pid})
    try:
        stacks = dump_stacks(pids=pids, timeout=30.0)
    except Exception as error:
        report.warnings.append(f"py-spy stacks of stuck workers failed: {error}")
        return
    processes = getattr(stacks, "processes", None) or []
    by_pid = {getattr(process, "pid", None): process for process in processes}
    for item in report.stuck:
        found = by_pid.get(item.pid)
        item.stack = dataclasses.asdict(found) if dataclasses.is_dataclass(found) else found


def _explain(text: str) -> tuple[str | None, str | None]:
    from raysleuth.explain import explain

    try:
        matches = explain(text)
    except Exception:
        return None, None
    if not matches:
        return None, None
    first = matches[0]
    return getattr(first, "cause", None), getattr(first, "fix", None)


_OWN_CLASSES = ("EvidenceWriter", "NodeAgent")


def _is_raysleuth(item: dict[str, Any]) -> bool:
    """An actor (or a task of one) that raysleuth itself runs."""
    if item.get("ray_namespace") == "raysleuth":
        return True
    name = str(item.get("class_name") or item.get("func_or_class_name") or item.get("name") or "")
    return name.split(".")[0] in _OWN_CLASSES or name.rsplit(".", 1)[-1] in _OWN_CLASSES


def _failed(tasks, actors_by_id, rank_of, explain: bool) -> list[FailedTask]:
    result = []
    for task in tasks:
        if task.get("state") != "FAILED":
            continue
        message = (task.get("error_message") or "").strip()
        actor = actors_by_id.get(task.get("actor_id")) or {}
        pid = task.get("worker_pid") or actor.get("pid")
        cause, fix = _explain(f"{task.get('error_type') or ''}\n{message}") if explain else (None, None)
        result.append(FailedTask(
            task_id=task.get("task_id"), name=_short(task), error_type=task.get("error_type"),
            error_message=redact_text(message[-2000:]), node_id=task.get("node_id"), pid=pid,
            rank=rank_of(task.get("node_id"), pid, actor.get("name")), actor_id=task.get("actor_id"),
            cause=cause, fix=fix, time=_seconds(task.get("end_time_ms")),
        ))
    result.sort(key=lambda item: item.time or 0)
    return result


def _dead(actors, node_ips, rank_of, explain: bool, job_id: str | None) -> list[DeadActor]:
    result = []
    for actor in actors:
        if actor.get("state") != "DEAD" or (job_id and actor.get("job_id") != job_id):
            continue
        cause = death_cause(actor)
        fix = None
        if explain and cause["cause"] not in ("killed", "out_of_scope", "exited"):
            _c, fix = _explain(f"{cause['reason']}\n{cause['message']}")
        result.append(DeadActor(
            actor_id=actor.get("actor_id"), class_name=actor.get("class_name") or "?", name=actor.get("name") or None,
            rank=rank_of(actor.get("node_id"), actor.get("pid"), actor.get("name")), death_cause=cause["cause"],
            summary=cause["summary"], message=cause["message"][:2000], node_id=actor.get("node_id"),
            node_ip=node_ips.get(actor.get("node_id")), pid=actor.get("pid"),
            num_restarts=actor.get("num_restarts") or 0, fix=fix,
        ))
    return result
