"""Capture stacks cluster-wide: list processes per node, py-spy them in parallel, label them.

Fan-outs over the node agents (``raysleuth.agents``):

1. the State API names the cluster's workers, drivers, actors, running
   tasks and dead actors while every agent runs ``ps`` (titles, and the
   subprocesses of workers: DataLoader workers and the like) and reads its
   workers' rank clues (start-up environment, Ray Train's logs:
   :mod:`raysleuth.labels.live`); the evidence store gives recorded calls;
2. every agent runs ``py-spy dump --json`` on its local targets
   concurrently (``run_tools``), each with a per-process timeout;
3. by default a second py-spy round ``interval`` seconds later: what moved
   is working, what stayed is blocked (:mod:`raysleuth.stacks.verdict`).

Scale note: step 2 ships py-spy's raw JSON back (a few KB per process).
Past a few thousand processes, parse and group on the agent and ship only
the groups.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from raysleuth import agents, cluster
from raysleuth.cluster import own
from raysleuth.cluster.records import RayTask, RayWorker
from raysleuth.errors import UsageError, WorkerNotFound
from raysleuth.labels.live import apply_notes, collect_hints, merge_hints, registered_labels
from raysleuth.stacks.analysis import group_processes
from raysleuth.stacks.model import Missing, ProcessStack, StackReport
from raysleuth.stacks.sampling import safely as _safe, sample
from raysleuth.stacks.spy import NOT_PYTHON
from raysleuth.stacks.verdict import VerdictContext, build_verdict

__all__ = ["dump_stacks", "is_own_actor"]

_TERMINAL = ("FINISHED", "FAILED")


PS_ARGV = ["ps", "-e", "-o", "pid=,ppid=,args="]


def _parse_ps(result: dict[str, Any] | None) -> dict[int, tuple[int, str]]:
    """``pid -> (ppid, command line)`` from ``ps -e -o pid=,ppid=,args=``."""
    rows: dict[int, tuple[int, str]] = {}
    for line in ((result or {}).get("stdout") or "").splitlines():
        parts = line.strip().split(None, 2)
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            rows[int(parts[0])] = (int(parts[1]), parts[2] if len(parts) > 2 else "")
    return rows


def is_own_actor(label: dict[str, Any]) -> bool:
    """raysleuth's own actors (writer, agents): never shown."""
    return own.is_own(name=label.get("actor_name"), class_name=label.get("actor_class"),
                      namespace=label.get("namespace"))


def dump_stacks(
    address: str | None = None,
    *,
    pids: list[int] | None = None,
    native: bool = False,
    include_idle: bool = False,
    rank: int | list[int] | None = None,
    timeout: float = 30.0,
    include_self: bool = False,
    per_process_timeout: float | None = None,
    parallel: int | None = None,
    samples: int = 2,
    interval: float = 2.0,
    job: str | None = None,
    extra_rules: list | None = None,
) -> StackReport:
    """Dump, label, group and judge the stacks of every Ray worker and driver.

    ``pids``/``rank`` narrow the processes; ``native`` adds C/C++ frames (py-spy
    then pauses each process briefly); ``include_idle`` keeps idle pool workers
    and idle background threads. ``include_self`` keeps the calling process
    (a driver watchdog wants its own main thread). ``parallel``: py-spy
    processes at once per node (default: twice the node's cores, at most 32).
    ``samples``: 2 (default) reads every process twice, ``interval`` seconds
    apart, to tell a hung job (nothing moves) from a busy one; 1 reads once.
    ``extra_rules``: more verdict rules (``rule(processes, context) -> [Culprit]``, as strong as collective
    positions), e.g. :func:`raysleuth.stacks.stalled_ranks_rule`.
    ``job`` keeps one Ray job's processes (its id as ``ray job list`` or
    ``raysleuth tasks`` show it, e.g. ``02000000``).
    Returns within ``timeout`` seconds, the interval and every clue included: nodes,
    processes or clues that did not answer in time are listed in ``report.missing`` with the reason.
    """
    started = time.monotonic()
    if timeout <= 0:
        raise UsageError(f"timeout must be positive, got {timeout!r}", fix="pass e.g. --timeout 30")
    if samples > 1 and interval >= timeout:
        raise UsageError(f"the interval ({interval:g}s) must be shorter than the timeout ({timeout:g}s)",
                         fix="e.g. --interval 2 --timeout 30")
    if samples not in (1, 2) or interval < 0:
        raise UsageError(f"samples must be 1 or 2 and interval >= 0, got {samples!r}, {interval!r}",
                         fix="pass --once for one sample, or --interval 2")
    cluster.connect(address)
    deadline = started + timeout
    report = StackReport(captured_at=time.time(), native=native, include_idle=include_idle, samples=samples,
                         interval=interval if samples > 1 else 0.0)
    found = _discover(report, timeout)
    targets = _targets(report, found, include_self, include_idle)
    targets = _narrow(report, targets, pids, rank, job)
    report.timings["discover"] = time.monotonic() - started
    # Dead actors, recorded calls, collective positions and failed calls are read while py-spy runs and during
    # the interval, so they cost no time; all of it inside ``deadline``.
    sample(report, targets, found, native=native, include_idle=include_idle, deadline=deadline,
           per_process_timeout=per_process_timeout, parallel=parallel, samples=samples, interval=interval)
    analyse = time.monotonic()

    # ---- group and judge
    ip_of = found["ip_of"]
    processes = [proc for node in sorted(targets, key=lambda n: ip_of.get(n) or "") for proc in targets[node]
                 if proc.error != NOT_PYTHON]
    processes.sort(key=lambda p: (p.role != "driver", p.rank if p.rank is not None else 1 << 30, p.node_ip or "", p.pid))
    report.processes = processes
    readable = [proc for proc in processes if proc.threads and not proc.exited]
    context = VerdictContext(tasks=found["tasks"],  # unfinished only: the listing asked the GCS for those
                             dead=_of_jobs(found.get("dead") or [], job), calls=found.get("calls") or [],
                             samples=samples, window=interval if samples > 1 else 0.0,
                             collective_positions=found.get("collectives") or [], failed=found.get("failed") or {},
                             exited=[p.label for p in processes if p.exited and p.role in ("driver", "actor", "task")])
    report.verdict = build_verdict(readable, context=context, extra_rules=extra_rules)
    report.groups = group_processes(readable)
    report.seconds = time.monotonic() - started
    report.timings["analyse"] = time.monotonic() - analyse
    return report


def _discover(report: StackReport, timeout: float) -> dict[str, Any]:
    """Who is where: State API listings, each node's `ps`, rank clues from the node agents."""
    phase = max(1.0, timeout * 0.4)
    with ThreadPoolExecutor(max_workers=8) as pool:
        listing = pool.submit(agents.call_agents, "run_tool", PS_ARGV, phase, timeout=phase)
        versions = pool.submit(agents.call_agents, "versions", timeout=phase)
        labels_f = pool.submit(_safe, registered_labels)
        hints_f = pool.submit(_safe, collect_hints, phase)
        workers_f = pool.submit(_safe, cluster.workers)
        tasks_f = pool.submit(_safe, _unfinished_tasks)
        node_list = cluster.nodes()
        listed, tools = listing.result(), versions.result()
        labels, labels_error = labels_f.result()
        hints, _hints_error = hints_f.result()
        workers, workers_error = workers_f.result()
        tasks, tasks_error = tasks_f.result()
    labels = labels or {}
    for what, error in (("actor labels", labels_error), ("running tasks", tasks_error)):
        if error:
            report.missing.append(Missing(reason=f"State API: no {what} ({error})"))
    no_notes: dict[str | None, str] = {None: "rank clues not read"}
    hints, notes, costs = hints or ({}, no_notes, {})
    merge_hints(labels, hints)
    apply_notes(labels, notes)
    report.timings["rank_hints_per_node"] = max(costs.values(), default=0.0)
    ip_of = {node.node_id: node.node_ip for node in node_list}
    alive = [node for node in node_list if node.alive]
    report.nodes = len(alive)
    for result in tools:
        if not result.ok:
            report.missing.append(Missing(node_ip=result.node_ip, reason=f"node agent: {result.error}"))
    table = {result.node_id: _parse_ps(result.value) for result in listed if result.ok}
    if workers is None:  # no State API: fall back to what each machine's `ps` shows
        report.missing.append(Missing(reason=f"State API: no worker list ({workers_error}); "
                                             "using `ps` on each node (drivers not found)"))
        workers = [RayWorker(worker_id=None, pid=pid, node_id=node, worker_type="WORKER", ip=ip_of.get(node))
                   for node, rows in table.items() for pid, (_ppid, title) in rows.items() if title.startswith("ray::")]
    return {
        "labels": labels, "workers": workers, "tasks": tasks or [], "table": table, "ip_of": ip_of,
        "py_spy": {r.node_id: (r.value or {}).get("py_spy_path") for r in tools if r.ok},
        "cores": {r.node_id: (r.value or {}).get("cpu_count") or 4 for r in tools if r.ok},
    }


def _targets(report: StackReport, found: dict[str, Any], include_self: bool, include_idle: bool
             ) -> dict[str, list[ProcessStack]]:
    """The processes to read, per node, labelled (role, actor, rank, running task)."""
    labels, table, ip_of = found["labels"], found["table"], found["ip_of"]
    running: dict[tuple[str | None, int], RayTask] = {}
    for task in found["tasks"]:
        if task.state == "RUNNING" and task.worker_pid:
            running[(task.node_id, task.worker_pid)] = task
    me = (os.getpid(), _my_node_id())
    targets: dict[str, list[ProcessStack]] = {}
    for worker in found["workers"]:
        pid, node_id, kind = worker.pid, worker.node_id, worker.worker_type
        if not pid or kind not in ("WORKER", "DRIVER"):
            continue  # spill/restore IO workers hold no user code
        node_ip = ip_of.get(node_id, worker.ip)
        label = labels.get((node_ip, pid), {})
        if is_own_actor(label):
            continue
        title = table.get(node_id, {}).get(pid, (None, ""))[1]
        process = ProcessStack(pid=pid, node_ip=node_ip, node_id=node_id, title=title[:200] or None,
                               actor_class=label.get("actor_class"), actor_name=label.get("actor_name"),
                               actor_id=label.get("actor_id"), rank=label.get("rank"),
                               rank_source=label.get("rank_source"), world_size=label.get("world_size"),
                               local_rank=label.get("local_rank"), rank_note=label.get("rank_note"),
                               job_id=label.get("job_id"))
        task = running.get((node_id, pid))
        if kind == "DRIVER":
            if (pid, node_id) == me and not include_self:
                continue
            process.role, process.job_id = "driver", (worker.worker_id or "")[:8] or None
            # the driver never inherits a worker's rank
            process.rank = process.rank_source = process.world_size = process.local_rank = None
        elif label.get("actor_id"):
            process.role = "actor"
        elif task is not None or (title.startswith("ray::") and "." in title.split()[0]):
            process.role = "task"
        elif title.startswith("ray::IDLE"):
            process.role = "idle worker"
        else:
            process.role = "worker"
        if task is not None:
            process.task_name, process.task_id = task.name, task.task_id
            process.job_id = task.job_id or process.job_id
        elif title.startswith("ray::") and "." in title.split()[0]:
            # Ray titles a busy worker ``ray::Class.method``; task events may lag behind.
            process.task_name = title.split()[0].removeprefix("ray::")
        if process.role == "idle worker" and not include_idle:
            continue
        targets.setdefault(node_id, []).append(process)
    _add_children(targets, table)
    return targets


def _add_children(targets: dict[str, list[ProcessStack]], table: dict) -> None:
    """Processes Ray does not name (DataLoader workers, subprocesses): children of a target."""
    for node_id, procs in list(targets.items()):
        rows = table.get(node_id, {})
        parents = {proc.pid: proc for proc in procs if proc.role != "driver"}
        for pid, (ppid, title) in sorted(rows.items()):
            owner = parents.get(ppid)
            while owner is None and ppid in rows and ppid not in parents and ppid > 1:
                ppid = rows[ppid][0]  # a grandchild belongs to the same worker
                owner = parents.get(ppid)
            if owner is None or pid in parents or title.startswith(("ps ", "py-spy")):
                continue
            procs.append(ProcessStack(pid=pid, node_ip=owner.node_ip, node_id=node_id, role="child",
                                      parent_pid=owner.pid, title=title[:200], actor_class=owner.actor_class,
                                      actor_name=owner.actor_name, rank=owner.rank, rank_source=owner.rank_source,
                                      task_name=owner.task_name))


def _of_jobs(dead: list[dict[str, Any]], job: str | None) -> list[dict[str, Any]]:
    return [item for item in dead if job is None or item.get("job_id") == job]


def _narrow(report: StackReport, targets: dict[str, list[ProcessStack]], pids: list[int] | None,
            rank: int | list[int] | None, job: str | None = None) -> dict[str, list[ProcessStack]]:
    """Only the pids / the rank(s) / the job asked for."""
    if job is not None:
        targets = {node: [p for p in procs if p.job_id == job] for node, procs in targets.items()}
        if not any(targets.values()):
            raise WorkerNotFound(f"no Ray worker or driver of job {job} is alive",
                                 fix="list the jobs with `ray job list` or `raysleuth tasks`")
    if pids:
        wanted = set(pids)
        targets = {node: [p for p in procs if p.pid in wanted] for node, procs in targets.items()}
        found = {p.pid for procs in targets.values() for p in procs}
        if not found:
            raise WorkerNotFound(f"no Ray worker or driver with pid {sorted(wanted)}",
                                 fix="list them with `raysleuth stacks --include-idle`")
        for pid in sorted(wanted - found):
            report.missing.append(Missing(pid=pid, reason="no Ray worker or driver with this pid"))
    if rank is not None:
        wanted_ranks = {rank} if isinstance(rank, int) else set(rank)
        known = sorted({p.rank for procs in targets.values() for p in procs if p.rank is not None})
        targets = {node: [p for p in procs if p.rank in wanted_ranks] for node, procs in targets.items()}
        if not any(targets.values()):
            named = f"rank {rank}" if isinstance(rank, int) else f"rank in {sorted(wanted_ranks)}"
            raise WorkerNotFound(f"no worker has {named} (known ranks: {known or 'none'})",
                                 fix="ranks come from raysleuth, Ray Train, RANK in the worker's environment, "
                                     "or actor names like 'trainer_rank3'")
        for missing in sorted(wanted_ranks - set(known)):
            report.missing.append(Missing(reason=f"no worker has rank {missing}"))
    return {node: procs for node, procs in targets.items() if procs}


def _my_node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


def _unfinished_tasks() -> list[RayTask]:
    """Tasks not finished or failed (running, or waiting to run): the wait-for edges."""
    return cluster.tasks(not_states=_TERMINAL, detail=True).items
