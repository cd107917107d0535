"""Clues besides the stacks, read for the verdict: dead actors with their ranks, recorded calls per rank.

I/O only (State API through :mod:`raysleuth.cluster`, the evidence store);
the rules that judge them are in :mod:`raysleuth.stacks.verdict`.
"""

from __future__ import annotations

import time
from typing import Any

from raysleuth import agents, cluster, evidence
from raysleuth.collectives import collect_collectives
from raysleuth.coroutines import CONTROL_KEY
from raysleuth.labels.dead import dead_worker_labels
from raysleuth.recorder import get_writer, open_store
from raysleuth.stacks.model import ProcessStack

__all__ = ["collective_positions", "dead_actors", "failed_calls", "progress_records", "read_coroutines", "recorded_calls",
           "request_coroutines", "thread_times", "unreturned"]


def dead_actors() -> list[dict[str, Any]]:
    """Dead actors with rank (labels.dead), death cause, and whether they were ended on purpose."""
    dead = list(cluster.actors(state="DEAD"))
    labels = dead_worker_labels(dead)
    found = []
    for actor in dead:
        label = labels.get(actor.actor_id, {})  # rank from the store, runtime_env, Ray Train or name
        cause, on_purpose = cluster.death_reason(actor)
        found.append({"actor_id": actor.actor_id, "pid": label.get("pid") or actor.pid,
                      "node_id": actor.node_id, "node_ip": label.get("node_ip"),
                      "actor_class": label.get("actor_class") or (actor.class_name or "").rsplit(".", 1)[-1],
                      "actor_name": label.get("actor_name"), "job_id": actor.job_id,
                      "rank": label.get("rank"), "rank_source": label.get("rank_source"),
                      "cause": cause, "on_purpose": on_purpose})
    return found


def recorded_calls(run: str | None = None, *, home: Any = None) -> list[dict[str, Any]]:
    """verl and pool calls per rank from the evidence store (``run``: default the connected or newest one):
    submitted, and whether they returned. The one pairing of submitted and returned rows: the verdict, the
    stall watchdog and ``integrations.verl.unreturned_calls`` all read it here."""

    store = open_store(run, home=home)
    try:
        verl_rows, pool_rows = evidence.read(store, evidence.VerlCall), evidence.read(store, evidence.PoolCall)
    finally:
        store.close()
    calls: dict[Any, dict[str, Any]] = {}
    for verl in verl_rows:
        row, task_id = verl.row, verl.task_id
        key = ("verl", task_id or (row.rank, row.name, row.pid))  # both rows come from the same driver
        if verl.state == "submitted":
            calls[key] = {"kind": "verl_call", "method": verl.method or row.name, "rank": row.rank,
                          "returned": False, "submitted": row.time, "worker_pid": verl.worker_pid,
                          "job_id": row.job_id, "task_id": task_id, "worker_name": verl.worker_name}
        elif verl.state == "returned" and key in calls:
            calls[key]["returned"] = True
    for pool in pool_rows:
        row, call_id = pool.row, pool.call_id
        if not call_id:
            continue
        entry = calls.setdefault(("pool", call_id), {"kind": "pool_call", "method": pool.function or row.name,
                                                     "rank": None, "returned": False, "submitted": row.time,
                                                     "worker_pid": None, "job_id": row.job_id, "task_id": call_id,
                                                     "worker_name": None})
        state = pool.state
        if state == "submitted":
            entry["submitted"] = row.time
            entry["rank"] = pool.worker_rank if "worker_rank" in pool.raw else entry["rank"]
        elif state == "running":
            entry["worker_pid"], entry["rank"] = row.pid, entry["rank"] if entry["rank"] is not None else row.rank
        elif state in ("finished", "failed"):
            entry["returned"] = True
    return list(calls.values())


def unreturned(calls: list[dict[str, Any]], *, kind: str = "verl_call", older_than: float = 0.0,
               now: float | None = None) -> list[dict[str, Any]]:
    """Of :func:`recorded_calls`, those of ``kind`` not returned ``older_than`` seconds after they were
    submitted, oldest first."""
    moment = time.time() if now is None else now
    return sorted((call for call in calls if call["kind"] == kind and not call["returned"]
                   and moment - call["submitted"] >= older_than), key=lambda call: call["submitted"])


def collective_positions(*, request: bool = True, wait: float = 1.5) -> list[dict[str, Any]]:
    """The collective-positions rule's culprits (issue 15): each rank's collectives, matched by sequence number.

    With ``request``, live instrumented workers are asked for a fresh dump
    (their control thread answers while the training thread is blocked in the
    collective) and given up to ``wait`` seconds; without, stored dumps only.
    Jobs without raysleuth in the workers have no dumps: then nothing.
    """

    report = collect_collectives(request=request, wait=wait)
    return [culprit.to_dict() for culprit in report.culprits]


def thread_times(targets: dict[str, list[ProcessStack]],
                 timeout: float = 5.0) -> tuple[dict[tuple, dict[int, Any]], set[str]]:
    """Progress counters per thread of every target (CPU, switches, I/O), from the node agents, read from
    ``/proc`` with no ptrace, and the nodes whose agent answered: on those, a target left out has exited
    (empty where no agent answers)."""
    try:
        results = agents.call_agents("thread_times", timeout=timeout, nodes=list(targets),
                                     per_node_args={node: ([p.pid for p in procs],) for node, procs in targets.items()})
    except Exception:
        return {}, set()
    times: dict[tuple, dict[int, Any]] = {}
    answered = set()
    for result in results:
        if result.ok:
            answered.add(result.node_id)
            for pid, threads in (result.value or {}).items():
                times[(result.node_id, int(pid))] = {int(tid): seconds for tid, seconds in threads.items()}
    return times, answered


def progress_records(since: float) -> dict[tuple, list[str]]:
    """Per ``(node_ip, pid)``, the progress its own records show since ``since``: heartbeats and steps that advanced.

    A ``heartbeat`` row (``rs.heartbeat``, ``rs.step``, or the collective wrapper's beat every 2 s while
    collectives complete) whose step is above every earlier step of the same process is progress.
    Jobs without raysleuth inside write none: then nothing.
    """

    store = open_store()
    try:
        beats = evidence.read(store, evidence.Heartbeat, since=since - 30.0)
    finally:
        store.close()
    best: dict[tuple, float] = {}
    found: dict[tuple, list[str]] = {}
    for beat in beats:
        row = beat.row
        step = row.step if row.step is not None else beat.step
        key = (row.node_ip, row.pid)
        if row.pid is None or step is None:
            continue
        previous = best.get(key)
        if row.time >= since and previous is not None and step > previous:
            source = beat.source
            what = "collectives" if source == "collectives" else "heartbeat step"
            found[key] = [f"{what} {previous:g} → {step:g}"]
        best[key] = max(step, previous if previous is not None else step)
    return found


def request_coroutines() -> str | None:
    """Ask every instrumented worker to list its pending coroutines (control key); returns the request id."""
    import uuid

    import ray

    request: dict[str, Any] = {"id": uuid.uuid4().hex[:12], "time": time.time()}
    try:
        ray.get(get_writer(create=False).set_control.remote(CONTROL_KEY, request), timeout=5)
    except Exception:
        return None
    return request["id"]


def read_coroutines(request_id: str | None) -> dict[tuple[str | None, int | None], list[dict[str, Any]]]:
    """``(node_ip, pid) -> pending tasks`` from the workers that answered ``request_id``."""
    if request_id is None:
        return {}

    store = open_store()
    try:
        dumps = evidence.read(store, evidence.Coroutines, since=time.time() - 120)
    finally:
        store.close()
    # The longest waits are the ones that matter (a worker lists them longest first); 50 keep a report small.
    return {(dump.row.node_ip, dump.row.pid): list(dump.tasks)[:50] for dump in dumps
            if dump.row.pid is not None and (dump.request or {}).get("id") == request_id}


def failed_calls(job_ids: set[str]) -> dict[tuple, str]:
    """``(node_id, pid) -> error text`` of each worker's newest failed call in these jobs."""
    found: dict[tuple, tuple[float, str]] = {}
    for job_id in sorted(job_ids):
        for task in cluster.tasks(state="FAILED", job_id=job_id, limit=500, detail=True).items:
            if task.worker_pid is None:
                continue
            key, when = (task.node_id, task.worker_pid), task.end_time_ms or 0.0
            if key not in found or when >= found[key][0]:
                found[key] = (when, f"{task.error_type or ''}: {task.error_message or ''}".strip(": "))
    return {key: text for key, (_when, text) in found.items()}
