"""Two samples and the counters between them: what each process did over the capture window.

I/O: py-spy rounds through the node agents (:mod:`raysleuth.stacks.spy`),
the key threads' ``/proc`` counters before and after (CPU, context
switches, I/O), the Ray calls that finished or started on each worker in
between, heartbeats and collective beats in the store, the coroutines of
instrumented async actors, and the clues (dead actors, recorded calls,
collective positions, failed calls). Everything runs inside the capture's
deadline: a clue not read by then is listed as missing, never waited for.
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from typing import Any

from raysleuth import cluster
from raysleuth.stacks.analysis import is_ray_idle, key_thread, signature
from raysleuth.stacks.clues import (
    collective_positions, dead_actors, failed_calls, progress_records, read_coroutines, recorded_calls,
    request_coroutines, thread_times,
)
from raysleuth.stacks.model import Missing, ProcessStack, StackReport
from raysleuth.stacks.progress import classify, thread_deltas
from raysleuth.stacks.spy import spy_round

__all__ = ["safely", "sample"]

_TERMINAL = ("FINISHED", "FAILED")


def safely(function, *args, **kwargs) -> tuple[Any, str | None]:
    """``(function(...), None)``, or ``(None, "Error: why")``: a clue that fails is a reason, never a crash."""
    try:
        return function(*args, **kwargs), None
    except Exception as error:  # partial results: the reason goes into the report
        return None, f"{type(error).__name__}: {str(error)[:200]}"


def _running(tasks) -> dict[tuple, set[str]]:
    found: dict[tuple, set[str]] = {}
    for task in tasks or []:
        if task.state == "RUNNING" and task.worker_pid:
            found.setdefault((task.node_id, task.worker_pid), set()).add(task.task_id)
    return found


def sample(report: StackReport, targets: dict[str, list[ProcessStack]], found: dict[str, Any], *, native: bool,
           include_idle: bool, deadline: float, per_process_timeout: float | None, parallel: int | None,
           samples: int, interval: float) -> None:
    """py-spy on every node at once, twice by default; fills threads, counters, progress and ``found``'s clues."""
    started_wall = time.time()
    pool = ThreadPoolExecutor(max_workers=5)
    try:
        two = samples > 1
        clues = {"dead": pool.submit(safely, dead_actors), "calls": pool.submit(safely, recorded_calls),
                 "collectives": pool.submit(safely, functools.partial(collective_positions, request=two))}
        coroutines = pool.submit(safely, request_coroutines) if two else None
        first = time.monotonic()
        tools = spy_round(report, targets, found, native, include_idle, deadline, per_process_timeout, parallel)
        report.timings["py_spy"] = time.monotonic() - first
        if two and any(proc.threads for procs in targets.values() for proc in procs):
            _second(report, targets, found, pool, tools, first, native=native, include_idle=include_idle,
                    deadline=deadline, per_process_timeout=per_process_timeout, parallel=parallel, interval=interval)
            exited = [p for procs in targets.values() for p in procs if p.exited]
            if exited:  # a death in the window: the first listing was read before it
                clues["dead"] = pool.submit(safely, dead_after, exited, deadline)
            clues["records"] = pool.submit(safely, progress_records, started_wall)
            clues["coroutines"] = pool.submit(safely, read_coroutines, _result(coroutines, deadline, report, "") or None)
        if two:  # (one sample is the quick look: it stays as fast as before, without the failed calls' listing)
            jobs = {p.job_id for procs in targets.values() for p in procs if p.job_id and p.role != "driver"}
            clues["failed"] = pool.submit(safely, failed_calls, jobs)
        for name, future in clues.items():
            found[name] = _result(future, deadline, report, name)
    finally:
        pool.shutdown(wait=False)
    for item in found.get("dead") or []:
        item["node_ip"] = item.get("node_ip") or found["ip_of"].get(item.get("node_id"))
    _attach(targets, found)


def _result(future, deadline: float, report: StackReport, name: str) -> Any:
    if future is None:
        return None
    try:
        value, error = future.result(timeout=max(0.05, deadline - time.monotonic()))
    except FutureTimeout:
        report.missing.append(Missing(reason=f"{name}: not read within --timeout"))
        return None
    if error and name and not error.startswith("StoreNotFound"):  # no evidence yet: a job without raysleuth
        report.missing.append(Missing(reason=f"{name}: {error}"))
    return value


def _second(report: StackReport, targets: dict[str, list[ProcessStack]], found: dict[str, Any], pool, tools,
            first: float, *, native: bool, include_idle: bool, deadline: float, per_process_timeout: float | None,
            parallel: int | None, interval: float) -> None:
    """The second round: counters around the interval, py-spy again, and the Ray calls listed again."""
    earlier = {(proc.node_id, proc.pid): signature(proc) for procs in targets.values() for proc in procs
               if proc.threads}
    again = {node: [p for p in procs if (p.node_id, p.pid) in earlier] for node, procs in targets.items()}
    again = {node: procs for node, procs in again.items() if procs}
    counters_timeout = max(0.5, min(5.0, deadline - time.monotonic()))
    (before, _), window_start = thread_times(again, counters_timeout), time.monotonic()
    time.sleep(max(0.0, min(interval - (time.monotonic() - first), deadline - time.monotonic() - 1.0)))
    second = time.monotonic()
    spy_round(report, again, found, native, include_idle, deadline, per_process_timeout, parallel,
              tools=tools, second=True)
    (after, answered), window = thread_times(again, max(0.5, min(5.0, deadline - time.monotonic()))), \
        time.monotonic() - window_start
    tasks_now = pool.submit(safely, cluster.tasks, not_states=_TERMINAL, detail=True)
    report.timings["py_spy_2"] = time.monotonic() - second
    listed = _result(tasks_now, deadline, report, "running tasks (second listing)")
    was, now = _running(found["tasks"]), _running(listed.items if listed is not None else None)
    for key, old_signature in earlier.items():
        proc = next((p for p in (targets.get(key[0], []) if key[0] is not None else []) if p.pid == key[1]), None)
        if proc is None:
            continue
        if key in before and key not in after and key[0] in answered:
            _exited(report, proc)  # its agent answered without it: the pid left /proc during the window
            continue
        tid = progress_thread(proc)
        proc.counters = thread_deltas(before.get(key), after.get(key), tid, window)
        if proc.counters is None:
            proc.samples = 1  # no counters around the window: the same frames alone do not say it is stuck
        proc.moved_frames = signature(proc) != old_signature if proc.samples == 2 else None
        if proc.counters is not None and tid == proc.event_loop_thread:
            proc.counters["event_loop"] = 1.0  # an idle loop sleeps without waking; any timer wakes it
        ended = len(was.get(key, set()) - now.get(key, set())) if listed is not None else 0
        if ended:  # (a call that started counts for nothing: a request that starts and then hangs starts too)
            proc.progress.append(f"Ray calls finished: {ended} in the window")


def _exited(report: StackReport, proc: ProcessStack) -> None:
    proc.exited, proc.moved_frames, proc.counters = True, None, None
    proc.error = "exited during the capture window (between the two samples)"
    report.missing.append(Missing(node_ip=proc.node_ip, pid=proc.pid, reason=f"{proc.label}: {proc.error}"))


def dead_after(exited: list[ProcessStack], deadline: float) -> list[dict[str, Any]]:
    """Dead actors, read again after targets exited in the window: until Ray lists each exited actor as
    dead (it learns of a death within a second or so), for at most 3 s and never past ``deadline``."""
    until = min(time.monotonic() + 3.0, deadline - 1.0)
    wanted = {(p.node_id, p.pid) for p in exited if p.role == "actor"}
    while True:
        dead = dead_actors()
        if wanted <= {(item.get("node_id"), item.get("pid")) for item in dead} or time.monotonic() >= until:
            return dead
        time.sleep(0.3)


def progress_thread(proc: ProcessStack) -> int | None:
    """The thread whose counters tell this process's progress: the key thread, or, for an async actor idle
    in Ray's task loop (its main thread wakes all the time), its event loop's thread."""
    thread = key_thread(proc)
    if thread is not None and proc.event_loop_thread and is_ray_idle(thread):
        return proc.event_loop_thread
    return thread.os_thread_id if thread else None


def _attach(targets: dict[str, list[ProcessStack]], found: dict[str, Any]) -> None:
    """Heartbeats and coroutines onto their processes; ``moved`` for the report."""
    records = found.get("records") or {}
    coroutines = found.get("coroutines") or {}
    for procs in targets.values():
        for proc in procs:
            proc.progress.extend(records.get((proc.node_ip, proc.pid), []) if proc.role != "child" else [])
            tasks = coroutines.get((proc.node_ip, proc.pid))
            if tasks is not None:
                proc.coroutines = tasks
            if proc.moved_frames is not None:
                classify(proc)  # fills progress from counters, for ``moved``
                proc.moved = proc.activity in ("working", "active")
