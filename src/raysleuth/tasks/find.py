"""Read the cluster's tasks and actors once and explain what waits, hangs, failed or died (:func:`find_tasks`)."""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Any

from raysleuth import cluster
from raysleuth.cluster import own
from raysleuth.cluster.records import RayActor, RayTask
from raysleuth.deaths import Death, build_death, find_deaths
from raysleuth.deaths.classify import DeathEvidence, classify
from raysleuth.explain import explain as explain_text  # the functions below take a flag named explain
from raysleuth.labels.live import registered_labels
from raysleuth.redaction import redact_text
from raysleuth.stacks import dump_stacks
from raysleuth.tasks.classify import RUNNING_STATES, TERMINAL_STATES, death_cause, is_stuck, seconds, short_name, started_at
from raysleuth.tasks.model import FailedTask, StuckTask, TaskReport
from raysleuth.tasks.pending import find_pending

__all__ = ["find_tasks"]


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

    def listing(name: str, function, **kwargs) -> list[Any]:
        if name not in listings:
            listings[name] = function(**kwargs)
            if listings[name].truncated:
                report.truncated = True
                report.truncated_listings.append(name)
                report.warnings.append(f"the State API returned only the first {len(listings[name])} {name}; "
                                       "the rest were not examined")
        return listings[name].items

    tasks = _listed_tasks(listing, unfinished=pending or stuck, failed=failed, peers=stuck)
    if job_id:
        tasks = [task for task in tasks if task.job_id == job_id]
    actors: list[RayActor] = listing("actors", cluster.actors)
    # raysleuth's own actors (writer, agents: namespace "raysleuth") are never the user's problem
    ours = {actor.actor_id for actor in actors if _is_raysleuth(actor.namespace, actor.class_name, actor.name)}
    actors = [actor for actor in actors if actor.actor_id not in ours]
    tasks = [task for task in tasks if task.actor_id not in ours and not _is_raysleuth(None, task.function, task.name)]
    actors_by_id = {actor.actor_id: actor for actor in actors}
    nodes = cluster.nodes(alive_only=True)
    node_ips = {node.node_id: node.node_ip for node in cluster.nodes()}
    capacities = [node.resources_total for node in nodes]
    labels: dict | None = None

    def rank_of(node_id: str | None, pid: int | None, actor_name: str | None = None) -> int | None:
        nonlocal labels
        rank = cluster.rank_from_name(actor_name)
        if rank is not None:
            return rank
        if labels is None:
            try:
                labels = registered_labels()
            except Exception:
                labels = {}
        entry = labels.get((node_ips.get(node_id), pid)) if pid else None
        return entry.get("rank") if entry else None

    if pending:
        report.pending = find_pending(tasks, actors_by_id, capacities, listing, now, older_than)
    if stuck:
        report.stuck = _stuck(tasks, now, stuck_factor, stuck_floor_s, node_ips, actors_by_id, rank_of)
        if stack and report.stuck:
            _attach_stacks(report)
    if failed:
        report.failed = _failed(tasks, actors_by_id, rank_of, explain)
    if dead:
        report.deaths = _dead(actors, node_ips, rank_of, explain, job_id)
        _classify_deaths(report, job_id)
    return report


PEER_NAMES = 16
"""Running task names whose finished peers are listed for the stuck rule (the most common first)."""
PEER_LIMIT = 1000
"""Finished peers listed per name: enough for a median."""


def _listed_tasks(listing, *, unfinished: bool, failed: bool, peers: bool) -> list[RayTask]:
    """The tasks the asked-for sections need, each listing filtered by the State API itself.

    A long-lived cluster keeps many thousands of finished tasks; listing them
    all (with their events) took seconds per call and was cut at the limit
    before the pending or running ones. Finished tasks are listed only as
    the peers of running ones (same name), for the stuck rule's median.
    """
    from concurrent.futures import ThreadPoolExecutor

    tasks: list[RayTask] = []
    if unfinished:
        tasks += listing("unfinished tasks", cluster.tasks, not_states=tuple(TERMINAL_STATES))
    if failed:
        tasks += listing("failed tasks", cluster.tasks, state="FAILED")
    if peers:
        counts: dict[str, int] = defaultdict(int)
        for task in tasks:
            if task.state in RUNNING_STATES and task.name:
                counts[task.name] += 1
        names = sorted(counts, key=lambda name: -counts[name])[:PEER_NAMES]
        with ThreadPoolExecutor(max_workers=8) as pool:
            found = list(pool.map(lambda name: cluster.tasks(state="FINISHED", name=name, limit=PEER_LIMIT), names))
        tasks += [task for listed in found for task in listed]
    return tasks


def _classify_deaths(report: TaskReport, job_id: str | None) -> None:
    """The forensics' deaths (logs, agents, the store: raysleuth.deaths) in place of those judged from Ray's
    reasons alone; a dead actor the forensics did not see keeps its Ray-only one."""
    try:
        found = find_deaths(job_id=job_id)
    except Exception as error:
        report.warnings.append(f"death forensics failed, showing Ray's own reasons: {type(error).__name__}: {error}")
        return
    report.warnings += found.warnings
    seen = {death.actor_id for death in found.deaths if death.actor_id}
    for alone in report.deaths:
        death = next((d for d in found.deaths if d.actor_id == alone.actor_id), None)
        if death is None:
            continue
        if death.fix is None:
            death.fix = alone.fix  # the knowledge base's fix for Ray's reason, when the forensics have none
        if death.rank is None and alone.rank is not None:
            death.rank, death.rank_source = alone.rank, alone.rank_source or "registered"  # its instruments said
    report.deaths = found.deaths + [death for death in report.deaths if death.actor_id not in seen]


def _stuck(tasks, now, factor, floor_s, node_ips, actors_by_id, rank_of) -> list[StuckTask]:
    durations: dict[str | None, list[tuple[str, float]]] = defaultdict(list)
    running: list[tuple[RayTask, float]] = []
    for task in tasks:
        function = task.function or task.name
        start = started_at(task)
        if start is None:
            continue
        if task.state == "FINISHED":
            end = seconds(task.end_time_ms)
            if end is not None:
                durations[function].append((task.task_id, max(0.0, end - start)))
        elif task.state in RUNNING_STATES:
            elapsed = max(0.0, now - start)
            durations[function].append((task.task_id, elapsed))
            running.append((task, elapsed))
    result = []
    for task, elapsed in running:
        function = task.function or task.name
        peers = [value for task_id, value in durations[function] if task_id != task.task_id]
        stuck, median = is_stuck(elapsed, peers, factor=factor, floor_s=floor_s)
        if not stuck or median is None:
            continue
        actor = actors_by_id.get(task.actor_id)
        pid = task.worker_pid or (actor.pid if actor else None)
        result.append(StuckTask(
            task_id=task.task_id, name=short_name(task), state=task.state or "", running_s=elapsed,
            peer_median_s=median, peers=len(peers), ratio=elapsed / median if median > 0 else float("inf"),
            node_id=task.node_id, node_ip=node_ips.get(task.node_id), pid=pid,
            rank=rank_of(task.node_id, pid, actor.name if actor else None), actor_id=task.actor_id,
        ))
    result.sort(key=lambda item: -item.ratio)
    return result


def _attach_stacks(report: TaskReport) -> None:
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
        item.stack = dataclasses.asdict(found) if dataclasses.is_dataclass(found) and not isinstance(found, type) \
            else found


def _explain(text: str) -> tuple[str | None, str | None]:
    try:
        matches = explain_text(text)
    except Exception:
        return None, None
    if not matches:
        return None, None
    first = matches[0]
    return getattr(first, "cause", None), getattr(first, "fix", None)


def _is_raysleuth(namespace: str | None, class_or_function: str | None, name: str | None) -> bool:
    """An actor (or a task of one) that raysleuth itself runs."""
    return own.is_own(class_name=str(class_or_function or name or ""), namespace=namespace)


def _failed(tasks, actors_by_id, rank_of, explain: bool) -> list[FailedTask]:
    result = []
    for task in tasks:
        if task.state != "FAILED":
            continue
        message = (task.error_message or "").strip()
        actor = actors_by_id.get(task.actor_id)
        pid = task.worker_pid or (actor.pid if actor else None)
        cause, fix = _explain(f"{task.error_type or ''}\n{message}") if explain else (None, None)
        result.append(FailedTask(
            task_id=task.task_id, name=short_name(task), error_type=task.error_type,
            error_message=redact_text(message[-2000:]), node_id=task.node_id, pid=pid,
            rank=rank_of(task.node_id, pid, actor.name if actor else None), actor_id=task.actor_id,
            cause=cause, fix=fix, time=seconds(task.end_time_ms),
        ))
    result.sort(key=lambda item: item.time or 0)
    return result


def _dead(actors, node_ips, rank_of, explain: bool, job_id: str | None) -> list[Death]:
    """Each dead actor's :class:`Death` from what Ray recorded alone (the forensics replace it when they run)."""
    result = []
    for actor in actors:
        if actor.state != "DEAD" or (job_id and actor.job_id != job_id):
            continue
        found = DeathEvidence(actor=actor)
        subject = {"actor": actor, "actor_id": actor.actor_id, "pid": actor.pid, "node_id": actor.node_id,
                   "node_ip": node_ips.get(actor.node_id)}
        death = build_death(subject, found, classify(found), {"rank": rank_of(actor.node_id, actor.pid, actor.name)},
                            {})
        ray_says = death_cause(actor)
        if explain and death.fix is None and ray_says["cause"] not in ("killed", "out_of_scope", "exited"):
            _c, death.fix = _explain(f"{ray_says['reason']}\n{ray_says['message']}")
        result.append(death)
    return result
