"""Capture stacks cluster-wide: list processes per node, py-spy them in parallel, label them.

Two fan-outs over the node agents (``raysleuth.agents``):

1. the State API names the cluster's workers, drivers, actors and running
   tasks while every agent runs ``ps`` (titles, and the subprocesses of
   workers: DataLoader workers and the like);
2. every agent runs ``py-spy dump --json`` on its local targets
   concurrently (``run_tools``), each with a per-process timeout.

Scale note: step 2 ships py-spy's raw JSON back (a few KB per process).
Past a few thousand processes, parse and group on the agent and ship only
the groups.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from raysleuth import agents, cluster
from raysleuth.errors import ToolMissing, UsageError, WorkerNotFound
from raysleuth.stacks.analysis import build_verdict, fold_threads, group_processes, parse_py_spy
from raysleuth.stacks.model import Missing, ProcessStack, StackReport

__all__ = ["dump_stacks", "is_own_actor"]

OWN_PREFIXES = ("raysleuth-agent-",)
OWN_NAMES = ("raysleuth-writer",)
OWN_CLASSES = ("NodeAgent", "EvidenceWriter")
_UNFINISHED = ("FINISHED", "FAILED")


PS_ARGV = ["ps", "-e", "-o", "pid=,ppid=,args="]
NOT_PYTHON = "not a Python process"


def _parse_ps(result: dict[str, Any] | None) -> dict[int, tuple[int, str]]:
    """``pid -> (ppid, command line)`` from ``ps -e -o pid=,ppid=,args=``."""
    rows: dict[int, tuple[int, str]] = {}
    for line in ((result or {}).get("stdout") or "").splitlines():
        parts = line.strip().split(None, 2)
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            rows[int(parts[0])] = (int(parts[1]), parts[2] if len(parts) > 2 else "")
    return rows


def _not_python(result: dict[str, Any]) -> bool:
    text = ((result.get("stderr") or "") + (result.get("stdout") or "")).lower()
    return "failed to find python version" in text or "not a python" in text


def is_own_actor(label: dict[str, Any]) -> bool:
    """raysleuth's own actors (writer, agents): never shown."""
    name = label.get("actor_name") or ""
    return (name in OWN_NAMES or name.startswith(OWN_PREFIXES) or label.get("actor_class") in OWN_CLASSES
            or label.get("namespace") == agents.NAMESPACE)


def _py_spy_argv(path: str, pid: int, native: bool) -> list[str]:
    argv = [path, "dump", "--pid", str(pid), "--json"]
    # py-spy cannot read native frames without pausing the process.
    argv.append("--native" if native else "--nonblocking")
    return argv


def _spy_error(result: dict[str, Any], node_ip: str | None) -> str:
    if result.get("timed_out"):
        return f"py-spy {result.get('error')}"
    if result.get("error"):
        return f"py-spy could not run: {result['error']}"
    text = (result.get("stderr") or result.get("stdout") or "").strip()
    last = text.splitlines()[-1] if text else f"py-spy exited with {result.get('returncode')}"
    lowered = text.lower()
    if "permission denied" in lowered or "operation not permitted" in lowered:
        return (f"permission denied reading the process on {node_ip} ({last[:160]}): run the agents as the job's "
                "user, or set kernel.yama.ptrace_scope=0 / add CAP_SYS_PTRACE")
    if "no such process" in lowered or "failed to find process" in lowered or "doesn't exist" in lowered:
        return "the process exited before it could be read"
    return last[:300]


def _safe(function, *args, **kwargs) -> tuple[Any, str | None]:
    try:
        return function(*args, **kwargs), None
    except Exception as error:  # partial results: the reason goes into the report
        return None, f"{type(error).__name__}: {str(error)[:200]}"


def dump_stacks(
    address: str | None = None,
    *,
    pids: list[int] | None = None,
    native: bool = False,
    include_idle: bool = False,
    rank: int | None = None,
    timeout: float = 30.0,
    include_self: bool = False,
    per_process_timeout: float | None = None,
    parallel: int | None = None,
) -> StackReport:
    """Dump, label, group and judge the stacks of every Ray worker and driver.

    ``pids``/``rank`` narrow the processes; ``native`` adds C/C++ frames (py-spy
    then pauses each process briefly); ``include_idle`` keeps idle pool workers
    and idle background threads. ``include_self`` keeps the calling process
    (a driver watchdog wants its own main thread). ``parallel``: py-spy
    processes at once per node (default: twice the node's cores, at most 32).
    Returns within about
    ``timeout`` seconds: nodes or processes that did not answer are listed in
    ``report.missing`` with the reason.
    """
    started = time.monotonic()
    if timeout <= 0:
        raise UsageError(f"timeout must be positive, got {timeout!r}", fix="pass e.g. --timeout 30")
    cluster.connect(address)
    deadline = started + timeout
    report = StackReport(captured_at=time.time(), native=native, include_idle=include_idle)

    # ---- 1. who is where: the State API names this cluster's workers and drivers,
    # each agent lists its machine's processes (titles, children) with `ps`.
    phase = max(1.0, timeout * 0.4)
    with ThreadPoolExecutor(max_workers=6) as pool:
        listing = pool.submit(agents.call_agents, "run_tool", PS_ARGV, phase, timeout=phase)
        versions = pool.submit(agents.call_agents, "versions", timeout=phase)
        labels_f = pool.submit(_safe, cluster.worker_labels)
        workers_f = pool.submit(_safe, cluster.workers)
        tasks_f = pool.submit(_safe, _unfinished_tasks)
        node_list = cluster.nodes(alive_only=True)
        listed, tools = listing.result(), versions.result()
        labels, labels_error = labels_f.result()
        workers, workers_error = workers_f.result()
        tasks, tasks_error = tasks_f.result()
    labels = labels or {}
    tasks = tasks or []
    for what, error in (("actor labels", labels_error), ("running tasks", tasks_error)):
        if error:
            report.missing.append(Missing(reason=f"State API: no {what} ({error})"))
    ip_of = {node["node_id"]: node["node_ip"] for node in node_list}
    report.nodes = len(node_list)
    for result in tools:
        if not result.ok:
            report.missing.append(Missing(node_ip=result.node_ip, reason=f"node agent: {result.error}"))
    py_spy = {result.node_id: (result.value or {}).get("py_spy_path") for result in tools if result.ok}
    cores = {result.node_id: (result.value or {}).get("cpu_count") or 4 for result in tools if result.ok}
    table = {result.node_id: _parse_ps(result.value) for result in listed if result.ok}
    if workers is None:  # no State API: fall back to what each machine's `ps` shows
        report.missing.append(Missing(reason=f"State API: no worker list ({workers_error}); "
                                             "using `ps` on each node (drivers not found)"))
        workers = [{"node_id": node, "pid": pid, "worker_type": "WORKER", "ip": ip_of.get(node)}
                   for node, rows in table.items() for pid, (_ppid, title) in rows.items() if title.startswith("ray::")]
    report.timings["discover"] = time.monotonic() - started

    running: dict[tuple[str | None, int], dict[str, Any]] = {}
    for task in tasks:
        if task.get("state") == "RUNNING" and task.get("worker_pid"):
            task["node_ip"] = ip_of.get(task.get("node_id"))
            running[(task.get("node_id"), task["worker_pid"])] = task

    # ---- 2. the targets per node
    me = (os.getpid(), _my_node_id())
    targets: dict[str, list[ProcessStack]] = {}
    for worker in workers:
        pid, node_id, kind = worker.get("pid"), worker.get("node_id"), worker.get("worker_type")
        if not pid or kind not in ("WORKER", "DRIVER"):
            continue  # spill/restore IO workers hold no user code
        node_ip = ip_of.get(node_id, worker.get("ip"))
        label = labels.get((node_ip, pid), {})
        if is_own_actor(label):
            continue
        title = table.get(node_id, {}).get(pid, (None, ""))[1]
        process = ProcessStack(pid=pid, node_ip=node_ip, node_id=node_id, title=title[:200] or None,
                               actor_class=label.get("actor_class"), actor_name=label.get("actor_name"),
                               actor_id=label.get("actor_id"), rank=label.get("rank"))
        task = running.get((node_id, pid))
        if kind == "DRIVER":
            if (pid, node_id) == me and not include_self:
                continue
            process.role, process.job_id = "driver", (worker.get("worker_id") or "")[:8] or None
        elif label.get("actor_id"):
            process.role = "actor"
        elif task is not None or (title.startswith("ray::") and "." in title.split()[0]):
            process.role = "task"
        elif title.startswith("ray::IDLE"):
            process.role = "idle worker"
        else:
            process.role = "worker"
        if task is not None:
            process.task_name, process.task_id = task.get("name"), task.get("task_id")
            process.job_id = task.get("job_id")
        elif title.startswith("ray::") and "." in title.split()[0]:
            # Ray titles a busy worker ``ray::Class.method``; task events may lag behind.
            process.task_name = title.split()[0].removeprefix("ray::")
        if process.role == "idle worker" and not include_idle:
            continue
        targets.setdefault(node_id, []).append(process)
    # Processes Ray does not name (DataLoader workers, subprocesses): children of a target.
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
                                      actor_name=owner.actor_name, rank=owner.rank, task_name=owner.task_name))

    # ---- 3. narrow to what was asked
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
        known = sorted({p.rank for procs in targets.values() for p in procs if p.rank is not None})
        targets = {node: [p for p in procs if p.rank == rank] for node, procs in targets.items()}
        if not any(targets.values()):
            raise WorkerNotFound(f"no worker has rank {rank} (known ranks: {known or 'none'})",
                                 fix="ranks come from rs.set_rank / RANK in the worker, or actor names like 'trainer_rank3'")
    targets = {node: procs for node, procs in targets.items() if procs}

    # ---- 4. py-spy on every node at once
    left = deadline - time.monotonic()
    spy_timeout = per_process_timeout or max(1.0, min(10.0, left * 0.8))
    per_node_args = {}
    for node_id, procs in list(targets.items()):
        path = py_spy.get(node_id)
        if not path:
            reason = (f"py-spy not found on node {ip_of.get(node_id)}: install it in the job's environment "
                      '(pip install py-spy, or runtime_env={"pip": ["py-spy"]})')
            report.missing.append(Missing(node_ip=ip_of.get(node_id), reason=reason))
            for proc in procs:
                proc.error = reason
            continue
        # py-spy is CPU-bound while it reads a process: more at once than ~2 per core only queues.
        width = parallel or min(32, 2 * cores.get(node_id, 4))
        per_node_args[node_id] = ([_py_spy_argv(path, p.pid, native) for p in procs], spy_timeout,
                                  max(1, min(width, len(procs))))
    if targets and not per_node_args:
        raise ToolMissing("py-spy is not installed on any node with Ray workers",
                          fix='pip install py-spy on every node (or runtime_env={"pip": ["py-spy"]})')
    if per_node_args:
        results = agents.call_agents("run_tools", timeout=max(1.0, deadline - time.monotonic()),
                                     nodes=list(per_node_args), per_node_args=per_node_args)
        for result in results:
            procs = targets[result.node_id]
            if not result.ok:
                report.missing.append(Missing(node_ip=result.node_ip, reason=f"node agent: {result.error}"))
                for proc in procs:
                    proc.error = f"node agent did not answer: {result.error}"
                continue
            for proc, done in zip(procs, result.value):
                proc.seconds = done.get("seconds")
                if done.get("returncode") == 0:
                    try:
                        threads = parse_py_spy(json.loads(done.get("stdout") or "[]"), pid=proc.pid)
                    except (ValueError, TypeError) as error:
                        proc.error = f"unreadable py-spy output ({error})"
                        continue
                    proc.threads, proc.folded_threads = fold_threads(threads, include_idle)
                elif proc.role == "child" and _not_python(done):
                    proc.error = NOT_PYTHON  # a non-Python subprocess: nothing to show
                    continue
                else:
                    proc.error = _spy_error(done, result.node_ip)
                if proc.error:
                    report.missing.append(Missing(node_ip=proc.node_ip, pid=proc.pid, reason=proc.error))

    report.timings["py_spy"] = time.monotonic() - started - report.timings["discover"]

    # ---- 5. group and judge
    processes = [proc for node in sorted(targets, key=lambda n: ip_of.get(n) or "") for proc in targets[node]
                 if proc.error != NOT_PYTHON]
    processes.sort(key=lambda p: (p.role != "driver", p.rank if p.rank is not None else 1 << 30, p.node_ip or "", p.pid))
    report.processes = processes
    readable = [proc for proc in processes if proc.threads]
    report.groups = group_processes(readable)
    report.verdict = build_verdict(readable, [t for t in tasks if t.get("state") not in _UNFINISHED])
    report.seconds = time.monotonic() - started
    report.timings["analyse"] = report.seconds - report.timings["discover"] - report.timings["py_spy"]
    return report


def _my_node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


def _unfinished_tasks() -> list[dict[str, Any]]:
    """Tasks not finished or failed (running, or waiting to run): the wait-for edges."""
    listing = cluster.tasks(filters=[("state", "!=", "FINISHED")], detail=True)
    return [task for task in listing.items if task.get("state") not in _UNFINISHED]
