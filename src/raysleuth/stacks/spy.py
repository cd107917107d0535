"""One py-spy read of every target, all nodes at once, through the node agents (``run_tools``)."""

from __future__ import annotations

import json
import time
from typing import Any

from raysleuth import agents
from raysleuth.errors import ToolMissing
from raysleuth.stacks.analysis import fold_threads, has_event_loop, parse_py_spy
from raysleuth.stacks.model import Missing, ProcessStack, StackReport

__all__ = ["NOT_PYTHON", "not_python", "spy_round"]

NOT_PYTHON = "not a Python process"


def not_python(result: dict[str, Any]) -> bool:
    text = ((result.get("stderr") or "") + (result.get("stdout") or "")).lower()
    return "failed to find python version" in text or "not a python" in text


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


def spy_round(report: StackReport, targets: dict[str, list[ProcessStack]], found: dict[str, Any], native: bool,
               include_idle: bool, deadline: float, per_process_timeout: float | None, parallel: int | None,
               *, tools: Any = None, second: bool = False) -> Any:
    """One py-spy read of every target, all nodes at once; fills threads or errors in place."""
    ip_of, py_spy, cores = found["ip_of"], found["py_spy"], found["cores"]
    left = deadline - time.monotonic()
    spy_timeout = per_process_timeout or max(1.0, min(10.0, left * 0.8))
    per_node_args = {}
    for node_id, procs in list(targets.items()):
        path = py_spy.get(node_id)
        if not path:
            if not second:
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
    if targets and not per_node_args and not second:
        raise ToolMissing("py-spy is not installed on any node with Ray workers",
                          fix='pip install py-spy on every node (or runtime_env={"pip": ["py-spy"]})')
    if not per_node_args:
        return None
    results = agents.call_agents("run_tools", timeout=max(1.0, deadline - time.monotonic()),
                                 nodes=list(per_node_args), per_node_args=per_node_args)
    for result in results:
        procs = targets[result.node_id]
        if not result.ok:
            if not second:
                report.missing.append(Missing(node_ip=result.node_ip, reason=f"node agent: {result.error}"))
                for proc in procs:
                    proc.error = f"node agent did not answer: {result.error}"
            continue
        for proc, done in zip(procs, result.value):
            _read_one(report, proc, done, result.node_ip, include_idle, second)
    return results


def _read_one(report: StackReport, proc: ProcessStack, done: dict[str, Any], node_ip: str | None,
              include_idle: bool, second: bool) -> None:
    """One py-spy answer into its process (a failed second read keeps the first)."""
    if done.get("returncode") == 0:
        try:
            threads = parse_py_spy(json.loads(done.get("stdout") or "[]"), pid=proc.pid)
        except (ValueError, TypeError) as error:
            if not second:
                proc.error = f"unreadable py-spy output ({error})"
            return
        proc.seconds = done.get("seconds")
        proc.samples = 2 if second else 1
        loops = [thread for thread in threads if has_event_loop(thread)]  # before idle threads are folded
        proc.event_loop = bool(loops)
        proc.event_loop_thread = loops[0].os_thread_id if loops else None
        proc.threads, proc.folded_threads = fold_threads(threads, include_idle)
        return
    if second:
        return
    proc.seconds = done.get("seconds")
    if proc.role == "child" and not_python(done):
        proc.error = NOT_PYTHON  # a non-Python subprocess: nothing to show
        return
    proc.error = _spy_error(done, node_ip)
    report.missing.append(Missing(node_ip=proc.node_ip, pid=proc.pid, reason=proc.error))
