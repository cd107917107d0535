"""Collecting the evidence a dead worker left, from everywhere it outlives the process.

- Ray's State API (through :mod:`raysleuth.cluster`): dead actors with their
  ``death_cause``, dead workers with ``exit_type``/``exit_detail``, the call
  each was running, the node's state.
- The worker's own ``.err``/``.out`` logs and raysleuth's zero-code
  fatal-signal file ``raysleuth-fatal-<pid>.log``: read on each node by the
  node agent, one call per node for all its dead pids, nodes in parallel
  (it also looks in ``logs/old/``, where Ray's log monitor moves dead
  workers' files and where Ray's log API no longer finds them). Pids the
  agent cannot serve fall back to Ray's log API by actor id or pid, on
  ``parallel`` threads.
- The node agent: kernel-log OOM kills where permitted and the memory
  cgroup's ``oom_kill`` count (only asked when a worker vanished without output).
- The evidence store: the worker's last memory samples, crash capsules,
  and its peers' last heartbeats.

Every source may fail; what could not be read is said in the evidence.
Scale: one agent call per node regardless of the number of deaths (100
dead actors: under half a second, ``bench/bench_deaths.py``); the State API
listings are capped at its limit, and past a few thousand deaths per node
the agent's reply (200 lines per log) becomes the cost: read fewer lines.
"""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from raysleuth import cluster, evidence
from raysleuth.agents import call_agents
from raysleuth.cluster import own
from raysleuth.cluster.records import RayTask
from raysleuth.deaths.classify import DeathEvidence
from raysleuth.recorder import open_store

__all__ = ["fetch_logs", "gather"]

#: Worker exit types that mean "died", not "an idle worker Ray retired".
DIED_EXIT_TYPES = frozenset({"SYSTEM_ERROR", "USER_ERROR", "NODE_OUT_OF_MEMORY"})


def _log(key: tuple, tail: int) -> tuple[tuple, list[str] | None, str | None]:
    kind, ident, node_id, suffix = key
    try:
        if kind == "actor":
            lines = cluster.worker_log(actor_id=ident, suffix=suffix, tail=tail, timeout=20)
        elif kind == "pid":
            lines = cluster.worker_log(pid=ident, node_id=node_id, suffix=suffix, tail=tail, timeout=20)
        else:
            lines = cluster.log_file(node_id=node_id, filename=ident, tail=tail, timeout=20)
        return key, lines, None
    except Exception as error:
        return key, None, str(error).split(" (", 1)[0][:200]


def fetch_logs(keys: list[tuple], *, tail: int = 200, parallel: int = 16) -> dict[tuple, tuple[list[str] | None, str | None]]:
    """Read many logs at once: ``key -> (lines or None, problem)``.

    A key is ``("actor", actor_id, node_id, suffix)``, ``("pid", pid, node_id,
    suffix)`` or ``("file", filename, node_id, None)``.
    """
    if not keys:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(keys)))) as pool:
        return {key: (lines, problem) for key, lines, problem in pool.map(lambda k: _log(k, tail), keys)}


def _oom_readings(node_ids: set[str], timeout: float) -> dict[str, dict[str, Any]]:
    if not node_ids:
        return {}
    try:
        results = call_agents("oom_evidence", timeout=timeout, nodes=sorted(node_ids))
    except Exception as error:
        return {node_id: {"error": f"{type(error).__name__}: {str(error)[:200]}"} for node_id in node_ids}
    return {result.node_id: (result.value if result.ok else {"error": result.error}) for result in results}


def _store_evidence(subjects: list[dict[str, Any]]) -> dict[str, Any]:
    """Memory samples, capsules and heartbeats from the connected run's store (empty without one)."""
    out: dict[str, Any] = {"memory": defaultdict(list), "crash": defaultdict(list), "beats": {}}
    try:
        store = open_store()
    except Exception:
        return out
    wanted = {(subject.get("node_ip"), subject.get("pid")) for subject in subjects}
    actor_ids = {subject.get("actor_id") for subject in subjects if subject.get("actor_id")}
    try:
        for sample in evidence.read(store, evidence.Memory, limit=20000, newest_first=True):
            key = (sample.row.node_ip, sample.row.pid)
            if key in wanted and len(out["memory"][key]) < 10:
                out["memory"][key].append({"time": sample.row.time, **{k: v for k, v in sample.to_data().items()
                                                                       if k in sample.raw and (k.endswith("_bytes")
                                                                                               or k == "source")}})
        for crash in evidence.read(store, evidence.Crash, limit=2000):
            row = crash.row
            whose = row.actor_id if row.actor_id in actor_ids else (row.node_ip, row.pid)
            out["crash"][whose].append({"id": row.id, "time": row.time, "exception_type": crash.exception_type,
                                      "message": crash.message[:500], "method": crash.method})
        for record in store.query("heartbeat", limit=5000, newest_first=True):
            if record.rank is not None and record.rank not in out["beats"]:
                out["beats"][record.rank] = {"step": record.step, "time": record.time,
                                             "pid": record.pid, "node_ip": record.node_ip}
    except Exception:
        pass
    finally:
        store.close()
    for key in out["memory"]:
        out["memory"][key].reverse()
    return out


def _subjects(actors, workers, tasks, node_ips, job_id) -> list[dict[str, Any]]:
    """One entry per dead actor and per task worker that died: identity plus its State API rows."""
    actor_pids = {(actor.node_id, actor.pid) for actor in actors}
    workers_by_pid = {(worker.node_id, worker.pid): worker for worker in workers}
    last_call: dict[Any, RayTask] = {}
    for task in sorted(tasks, key=lambda t: t.end_time_ms or 0):
        if task.actor_id:
            last_call[task.actor_id] = task
        if task.worker_pid:
            last_call[(task.node_id, task.worker_pid)] = task
        if task.worker_id:  # worker_pid is often empty on a call whose worker died
            last_call[task.worker_id] = task
    subjects = []
    for actor in actors:
        if job_id and actor.job_id != job_id:
            continue
        if own.is_own(name=actor.name, class_name=actor.class_name):
            continue
        key = (actor.node_id, actor.pid)
        subjects.append({"actor": actor, "worker": workers_by_pid.get(key), "task": last_call.get(actor.actor_id),
                         "actor_id": actor.actor_id, "pid": actor.pid, "node_id": actor.node_id,
                         "node_ip": node_ips.get(actor.node_id)})
    for worker in workers:
        key = (worker.node_id, worker.pid)
        if key in actor_pids or worker.worker_type not in (None, "WORKER"):
            continue
        if worker.exit_type not in DIED_EXIT_TYPES:
            continue
        task = last_call.get(key) or last_call.get(worker.worker_id)
        if job_id and task is not None and task.job_id != job_id:
            continue
        subjects.append({"actor": None, "worker": worker, "task": task, "actor_id": None, "pid": worker.pid,
                         "node_id": worker.node_id, "node_ip": node_ips.get(worker.node_id)})
    return subjects


def _agent_logs(subjects, alive, lines: int, timeout: float) -> tuple[dict, dict[str, str]]:
    """One node-agent call per alive node reads every dead pid's logs there: ``(node, pid) -> entry``."""
    per_node: dict[str, list[int]] = defaultdict(list)
    for subject in subjects:
        if subject["node_id"] and subject["pid"] and alive.get(subject["node_id"]):
            per_node[subject["node_id"]].append(int(subject["pid"]))
    if not per_node:
        return {}, {}
    try:
        results = call_agents("worker_logs", timeout=timeout, nodes=sorted(per_node),
                              per_node_args={node: (pids, lines) for node, pids in per_node.items()})
    except Exception as error:
        return {}, {node: f"{type(error).__name__}: {str(error)[:200]}" for node in per_node}
    found, failed = {}, {}
    for result in results:
        if not result.ok:
            failed[result.node_id] = result.error or "no answer"
            continue
        for pid, entry in (result.value or {}).items():
            found[(result.node_id, int(pid))] = entry
    return found, failed


def _read_logs(subjects, alive, lines: int, parallel: int, timeout: float) -> tuple[dict, dict[str, str]]:
    """Every dead worker's logs: through the node agents, else Ray's log API (in parallel)."""
    found, failed = _agent_logs(subjects, alive, lines, timeout)
    keys = []
    for subject in subjects:
        entry = found.get((subject["node_id"], subject["pid"]))
        if entry and "error" not in entry:
            continue
        for suffix in ("err", "out"):
            if subject["actor_id"]:
                keys.append(("actor", subject["actor_id"], subject["node_id"], suffix))
            elif subject["pid"] and subject["node_id"]:
                keys.append(("pid", subject["pid"], subject["node_id"], suffix))
    if keys:
        by_subject: dict[tuple, dict[str, Any]] = defaultdict(dict)
        pids = {subject["actor_id"]: subject["pid"] for subject in subjects if subject["actor_id"]}
        for (kind, ident, node_id, suffix), (text, problem) in fetch_logs(keys, tail=lines, parallel=parallel).items():
            pid = pids.get(ident) if kind == "actor" else ident
            entry = by_subject[(node_id, pid)]
            if text is not None:
                entry[suffix] = text
            elif problem:
                agent = found.get((node_id, pid), {}).get("error") or failed.get(node_id)
                entry["error"] = problem + (f"; node agent: {agent}" if agent else "")
        for key, entry in by_subject.items():
            if "err" in entry or "out" in entry:
                entry.pop("error", None)
            found[key] = {**found.get(key, {}), **entry} if "error" not in entry else entry
    return found, failed


def _vanished(subject: dict[str, Any]) -> bool:
    actor, worker = subject["actor"], subject["worker"]
    text = (actor.death.text if actor else "") + str(worker.exit_detail if worker else None)
    return "connection error code 2" in text or "End of file" in text


def gather(*, job_id: str | None = None, log_lines: int = 200, parallel: int = 16, oom: bool = True,
           timeout: float = 30.0) -> tuple[list[dict[str, Any]], list[DeathEvidence], dict[str, Any], list[str]]:
    """Collect the evidence of every death: ``(subjects, evidence, store, warnings)``."""
    warnings: list[str] = []
    actors = list(cluster.actors(state="DEAD"))
    try:
        workers = list(cluster.dead_workers())
    except Exception as error:
        workers = []
        warnings.append(f"dead workers not listed: {error}")
    try:
        tasks = [task for task in cluster.tasks(state="FAILED") if task.error_type in
                 ("ACTOR_DIED", "WORKER_DIED", "OUT_OF_MEMORY", "NODE_DIED", "TASK_EXECUTION_EXCEPTION")]
    except Exception as error:
        tasks = []
        warnings.append(f"failed tasks not listed: {error}")
    nodes = cluster.nodes()
    node_ips = {node.node_id: node.node_ip for node in nodes}
    alive = {node.node_id: node.alive for node in nodes}
    subjects = _subjects(actors, workers, tasks, node_ips, job_id)

    started = time.monotonic()
    logs, agent_problems = _read_logs(subjects, alive, log_lines, parallel, timeout)
    warnings += [f"node {node_ips.get(node) or node[:12]}: logs read through Ray's log API instead of the node agent "
                 f"({problem})" for node, problem in agent_problems.items()]
    oom_nodes = {s["node_id"] for s in subjects if oom and _vanished(s) and alive.get(s["node_id"])}
    readings = _oom_readings(oom_nodes, timeout) if oom_nodes else {}
    store = _store_evidence(subjects)
    store["log_seconds"] = time.monotonic() - started

    evidence = []
    for subject in subjects:
        found = logs.get((subject["node_id"], subject["pid"])) or {}
        err, out, fatal = found.get("err"), found.get("out"), found.get("fatal")
        problems = [problem for problem in (found.get("error"),) if problem]
        key = (subject["node_ip"], subject["pid"])
        capsules = store["crash"].get(subject["actor_id"]) or store["crash"].get(key) or []
        reading = readings.get(subject["node_id"])
        evidence.append(DeathEvidence(
            actor=subject["actor"], worker=subject["worker"], task=subject["task"],
            err_lines=err or [], out_lines=out or [], fatal_file=fatal,
            capsules=capsules, oom=reading if reading and "error" not in reading else None,
            memory_samples=store["memory"].get(key, []), node_alive=alive.get(subject["node_id"]),
            log_problems=[f"worker log not readable: {problem}" for problem in problems],
        ))
        if reading and "error" in reading:
            warnings.append(f"node {subject['node_ip']}: OOM evidence not read ({reading['error']})")
    return subjects, evidence, store, sorted(set(warnings))
