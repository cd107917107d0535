"""Clues besides the stacks, read for the verdict: dead actors with their ranks, recorded calls per rank.

I/O only (State API through :mod:`raysleuth.cluster`, the evidence store);
the rules that judge them are in :mod:`raysleuth.stacks.verdict`.
"""

from __future__ import annotations

from typing import Any

from raysleuth import agents, cluster
from raysleuth.labels.dead import dead_worker_labels
from raysleuth.stacks.model import ProcessStack

__all__ = ["collective_positions", "dead_actors", "recorded_calls", "thread_times"]


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


def recorded_calls() -> list[dict[str, Any]]:
    """verl and pool calls per rank from the evidence store: submitted, and whether they returned."""
    from raysleuth.recorder import open_store

    store = open_store()
    try:
        verl_rows, pool_rows = store.query("verl_call"), store.query("pool_call")
    finally:
        store.close()
    calls: dict[Any, dict[str, Any]] = {}
    for row in verl_rows:
        key = ("verl", row.data.get("task_id") or (row.rank, row.name, row.time))
        if row.data.get("state") == "submitted":
            calls[key] = {"kind": "verl_call", "method": row.data.get("method") or row.name, "rank": row.rank,
                          "returned": False, "submitted": row.time, "worker_pid": row.data.get("worker_pid")}
        elif row.data.get("state") == "returned" and key in calls:
            calls[key]["returned"] = True
    for row in pool_rows:
        call_id = row.data.get("call_id")
        if not call_id:
            continue
        entry = calls.setdefault(("pool", call_id), {"kind": "pool_call", "method": row.data.get("function") or row.name,
                                                     "rank": None, "returned": False, "submitted": row.time,
                                                     "worker_pid": None})
        state = row.data.get("state")
        if state == "submitted":
            entry["submitted"] = row.time
            entry["rank"] = row.data.get("worker_rank", entry["rank"])
        elif state == "running":
            entry["worker_pid"], entry["rank"] = row.pid, entry["rank"] if entry["rank"] is not None else row.rank
        elif state in ("finished", "failed"):
            entry["returned"] = True
    return list(calls.values())


def collective_positions(*, request: bool = True, wait: float = 1.5) -> list[dict[str, Any]]:
    """The collective-positions rule's culprits (issue 15): each rank's collectives, matched by sequence number.

    With ``request``, live instrumented workers are asked for a fresh dump
    (their control thread answers while the training thread is blocked in the
    collective) and given up to ``wait`` seconds; without, stored dumps only.
    Jobs without raysleuth in the workers have no dumps: then nothing.
    """
    from raysleuth.collectives import collect_collectives

    report = collect_collectives(request=request, wait=wait)
    return [culprit.to_dict() for culprit in report.culprits]


def thread_times(targets: dict[str, list[ProcessStack]]) -> dict[tuple, dict[int, float]]:
    """CPU seconds per thread of every target, from the node agents (empty where an agent does not answer)."""
    try:
        results = agents.call_agents("thread_times", timeout=5.0, nodes=list(targets),
                                     per_node_args={node: ([p.pid for p in procs],) for node, procs in targets.items()})
    except Exception:
        return {}
    times: dict[tuple, dict[int, float]] = {}
    for result in results:
        if result.ok:
            for pid, threads in (result.value or {}).items():
                times[(result.node_id, int(pid))] = {int(tid): seconds for tid, seconds in threads.items()}
    return times
