"""Node agents: one small actor per alive node for work that must run locally.

An agent is a detached, named actor (``raysleuth-agent-<node_id>`` in the
``raysleuth`` namespace) pinned to its node, reserving no CPU. It lists the
node's Ray worker processes, runs a local tool (py-spy) with a timeout,
reads process memory with psutil and reports the node's versions.

:func:`call_agents` fans one method out to every node in parallel and
returns one :class:`AgentResult` per node, with the reason when a node did
not answer in time: partial results, never a hang.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from raysleuth.errors import ClusterUnreachable

__all__ = ["AgentResult", "NodeAgent", "call_agents", "find_tool", "get_agents", "rank_hints", "read_train_logs",
           "thread_times", "versions"]

AGENT_PREFIX = "raysleuth-agent-"
NAMESPACE = "raysleuth"


def find_tool(name: str) -> str | None:
    """Path of an executable: on PATH, else beside this Python (a venv's bin)."""
    found = shutil.which(name)
    if found:
        return found
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.access(candidate, os.X_OK) else None


def _module_version(name: str) -> str | None:
    try:
        from importlib import metadata

        return metadata.version(name)
    except Exception:
        return None


def versions() -> dict[str, Any]:
    """Versions that must match across nodes, for this process's environment."""
    py_spy = find_tool("py-spy")
    return {
        "python": platform.python_version(),
        "ray": _module_version("ray"),
        "torch": _module_version("torch"),
        "raysleuth": _module_version("raysleuth"),
        "debugpy": _module_version("debugpy"),
        "psutil": _module_version("psutil"),
        "py-spy": _module_version("py-spy") if py_spy else None,
        "py_spy_path": py_spy,
        "executable": sys.executable,
        "cpu_count": os.cpu_count(),
    }


def _is_ray_worker(cmdline: list[str]) -> bool:
    if not cmdline:
        return False
    first = cmdline[0]
    return first.startswith("ray::") or any("default_worker.py" in part for part in cmdline[:4])


class NodeAgent:
    """Actor body: local work on one node."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.hostname = socket.gethostname()
        self.started = time.time()

    def ping(self) -> dict[str, Any]:
        """Who and where this agent is."""
        import ray

        return {
            "pid": self.pid,
            "hostname": self.hostname,
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "started": self.started,
        }

    def versions(self) -> dict[str, Any]:
        """Python, Ray, torch, raysleuth, py-spy versions on this node."""
        return versions()

    def list_processes(self, include_children: bool = True) -> list[dict[str, Any]]:
        """Ray worker processes on this node (and their children), with memory."""
        import psutil

        found = []
        workers: set[int] = set()
        for proc in psutil.process_iter(["pid", "ppid", "cmdline", "name", "create_time", "memory_info"]):
            info = proc.info
            cmdline = info.get("cmdline") or []
            if not _is_ray_worker(cmdline) or info["pid"] == self.pid:
                continue
            workers.add(info["pid"])
            found.append({
                "pid": info["pid"],
                "ppid": info["ppid"],
                "title": cmdline[0] if cmdline and cmdline[0].startswith("ray::") else " ".join(cmdline)[:200],
                "parent_pid": None,
                "rss_bytes": info["memory_info"].rss if info.get("memory_info") else None,
                "create_time": info.get("create_time"),
            })
        if include_children:
            for pid in list(workers):
                try:
                    children = psutil.Process(pid).children(recursive=True)
                except psutil.Error:
                    continue
                for child in children:
                    if child.pid in workers:
                        continue
                    try:
                        found.append({
                            "pid": child.pid,
                            "ppid": child.ppid(),
                            "title": " ".join(child.cmdline())[:200],
                            "parent_pid": pid,
                            "rss_bytes": child.memory_info().rss,
                            "create_time": child.create_time(),
                        })
                    except psutil.Error:
                        continue
        return found

    def rank_hints(self, pids: list[int] | None = None) -> dict[str, Any]:
        """Ranks of this node's Ray workers from outside: start-up environment and Ray Train's logs."""
        from raysleuth import cluster

        self._train_cache = getattr(self, "_train_cache", {})
        # This node's workers are the children of its raylet, which is the agent's own parent.
        return rank_hints(pids, logs_dir=cluster.local_logs_dir(), cache=self._train_cache, parent=os.getppid())

    def thread_times(self, pids: list[int]) -> dict[int, dict[int, float]]:
        """CPU seconds used so far by each thread of each pid (to tell a working thread from a stuck one)."""
        return thread_times(pids)

    def run_tool(self, argv: list[str], timeout: float = 10.0) -> dict[str, Any]:
        """Run a local program; returns returncode, stdout, stderr, timed_out, error."""
        return run_tool(argv, timeout)

    def run_tools(self, commands: list[list[str]], timeout: float = 10.0, parallel: int = 8) -> list[dict[str, Any]]:
        """Run several programs concurrently (each with ``timeout``), results in order."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            return list(pool.map(lambda argv: run_tool(argv, timeout), commands))

    def memory(self, pids: list[int]) -> dict[int, dict[str, Any]]:
        """RSS, USS (private) and VMS of each pid; an ``error`` for pids that are gone."""
        return process_memory(pids)

    def disk_free(self, path: str) -> dict[str, Any]:
        """Free and total bytes of the filesystem holding ``path``."""
        try:
            usage = shutil.disk_usage(path)
            return {"path": path, "free": usage.free, "total": usage.total}
        except OSError as error:
            return {"path": path, "error": str(error)}

    def py_spy_check(self) -> dict[str, Any]:
        """Is py-spy here, and may it read another process (ptrace)?"""
        return py_spy_check()

    def gpus(self) -> list[dict[str, Any]]:
        """This node's GPUs (index, name, total_bytes) from nvidia-smi; [] without one."""
        return gpus()


RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "WG_PREFIX",
                  "RAY_LOCAL_WORLD_SIZE")
"""Start-up environment variables that say which rank a process is (torchrun, runtime_env, verl)."""
TRAIN_LOG_HEAD = 8192


def _start_environment(proc) -> tuple[dict[str, str] | None, str | None]:
    """The rank variables a process started with (``/proc/<pid>/environ``), or why they cannot be read."""
    import psutil

    try:
        environ = proc.environ()
    except psutil.AccessDenied:
        return None, "start-up environment not readable (access denied: the agent runs as another user)"
    except psutil.NoSuchProcess:
        return None, "the process exited before its environment was read"
    except (psutil.Error, OSError) as error:
        return None, f"start-up environment not readable ({type(error).__name__})"
    return {key: environ[key] for key in RANK_VARIABLES if key in environ}, None


def read_train_logs(logs_dir: str | None, cache: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
    """Per pid: Ray Train's world/local/node rank from its structured worker logs on this node.

    Ray Train (v2) writes ``logs/train/ray-train-sys-worker-<worker id>.log``
    for each worker, one JSON object a line carrying ``process`` (the pid),
    ``world_rank``, ``local_rank``, ``node_rank``, ``actor_id`` and
    ``run_name``. Only the head of each file is read, and a file already read
    is not read again (``cache``); the newest file wins when a pid repeats.
    """
    import glob
    import json
    import re

    found: dict[int, dict[str, Any]] = {}
    if not logs_dir:
        return found
    cache = {} if cache is None else cache
    paths = glob.glob(os.path.join(logs_dir, "train", "ray-train-sys-worker-*.log"))
    entries = []
    for path in paths:
        entry = cache.get(path)
        if entry is None:
            try:
                with open(path, "rb") as handle:
                    head = handle.read(TRAIN_LOG_HEAD).decode("utf-8", "replace")
                mtime = os.path.getmtime(path)
            except OSError:
                continue
            entry = {}
            for line in head.splitlines():
                try:
                    data = json.loads(line)
                except ValueError:
                    continue
                if not entry and isinstance(data.get("process"), int) and data.get("world_rank") is not None:
                    entry = {"pid": data["process"], "rank": data.get("world_rank"),
                             "local_rank": data.get("local_rank"), "node_rank": data.get("node_rank"),
                             "actor_id": data.get("actor_id"), "run_name": data.get("run_name"), "mtime": mtime}
                size = re.search(r"world_size=(\d+)", str(data.get("message") or ""))
                if entry and size:
                    entry["world_size"] = int(size.group(1))
                    break
            if entry:
                cache[path] = entry  # complete once the pid and rank are in (the head never changes)
        if entry:
            entries.append(entry)
    for entry in sorted(entries, key=lambda item: item["mtime"]):
        found[entry["pid"]] = {key: value for key, value in entry.items() if key != "mtime"}
    return found


def _children(parent: int) -> list[int]:
    """Direct children of a process: ``/proc/<pid>/task/*/children`` (about 1 ms), else psutil's scan of /proc."""
    import glob

    import psutil

    found: list[int] = []
    paths = glob.glob(f"/proc/{parent}/task/*/children")
    try:
        for path in paths:
            with open(path) as handle:
                found += [int(pid) for pid in handle.read().split()]
        if paths:
            return found
    except (OSError, ValueError):
        pass
    try:
        return [child.pid for child in psutil.Process(parent).children()]
    except psutil.Error:
        return []


def rank_hints(pids: list[int] | None = None, *, logs_dir: str | None = None,
               cache: dict[str, Any] | None = None, parent: int | None = None) -> dict[str, Any]:
    """Rank clues for local Ray workers; never raises.

    Which processes: ``pids``; else the Ray workers among the children of
    ``parent`` (the node's raylet: cheap, and only this node's workers);
    else every ``ray::`` process on the machine.

    Returns ``{"processes": {pid: {"environment": {...} | None, "note": str | None,
    "train": {...} | None}}, "seconds": s}``. Ray Train sets ``RANK`` with
    ``os.environ`` after start-up, so its workers' ranks come from its logs.
    """
    import psutil

    started = time.perf_counter()
    train: dict[int, dict[str, Any]] = {}
    try:
        train = read_train_logs(logs_dir, cache)
    except Exception:
        pass
    result: dict[int, dict[str, Any]] = {}
    if pids is None and parent is not None:
        procs = []
        for pid in _children(parent):
            try:
                proc = psutil.Process(pid)
                if _is_ray_worker(proc.cmdline()):
                    procs.append(proc)
            except psutil.Error:
                continue
    elif pids is None:
        procs = []
        for proc in psutil.process_iter(["cmdline"]):
            if _is_ray_worker(proc.info.get("cmdline") or []):
                procs.append(proc)
    else:
        procs = []
        for pid in pids:
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                result[pid] = {"environment": None, "note": "the process exited before it was read", "train": None}
    for proc in procs:
        environment, note = _start_environment(proc)
        result[proc.pid] = {"environment": environment, "note": note, "train": train.get(proc.pid)}
    return {"processes": result, "seconds": time.perf_counter() - started}


def thread_times(pids: list[int]) -> dict[int, dict[int, float]]:
    """Per pid, per OS thread id: user + system CPU seconds so far; pids that are gone are left out."""
    import psutil

    found: dict[int, dict[int, float]] = {}
    for pid in pids:
        try:
            found[pid] = {thread.id: thread.user_time + thread.system_time for thread in psutil.Process(pid).threads()}
        except (psutil.Error, OSError):
            continue
    return found


def run_tool(argv: list[str], timeout: float) -> dict[str, Any]:
    """Run ``argv`` with a timeout; never raises."""
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                "timed_out": False, "error": None, "seconds": time.monotonic() - started}
    except subprocess.TimeoutExpired as expired:
        return {"returncode": None, "stdout": expired.stdout or "", "stderr": expired.stderr or "",
                "timed_out": True, "error": f"timed out after {timeout:g}s", "seconds": time.monotonic() - started}
    except OSError as error:
        return {"returncode": None, "stdout": "", "stderr": "", "timed_out": False,
                "error": str(error), "seconds": time.monotonic() - started}


def process_memory(pids: list[int]) -> dict[int, dict[str, Any]]:
    """RSS/USS/VMS of local pids with psutil."""
    import psutil

    result: dict[int, dict[str, Any]] = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            try:
                full = proc.memory_full_info()
                result[pid] = {"rss": full.rss, "uss": full.uss, "vms": full.vms}
            except psutil.AccessDenied:
                info = proc.memory_info()
                result[pid] = {"rss": info.rss, "uss": None, "vms": info.vms}
        except psutil.Error as error:
            result[pid] = {"error": f"{type(error).__name__}: {error}"}
    return result


def gpus() -> list[dict[str, Any]]:
    """Local GPUs from ``nvidia-smi`` (no torch needed); [] when there is none."""
    tool = find_tool("nvidia-smi")
    if tool is None:
        return []
    done = run_tool([tool, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"], timeout=10)
    found = []
    for line in (done["stdout"] or "").splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            try:
                found.append({"index": int(parts[0]), "name": parts[1], "total_bytes": int(float(parts[2])) * 1024**2})
            except ValueError:
                continue
    return found


def _ptrace_scope() -> int | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def py_spy_check() -> dict[str, Any]:
    """py-spy present and permitted: dump a short-lived child process to find out."""
    path = find_tool("py-spy")
    result: dict[str, Any] = {"available": path is not None, "path": path, "ptrace_scope": _ptrace_scope(),
                              "can_dump": False, "detail": ""}
    if path is None:
        result["detail"] = "py-spy is not installed here"
        return result
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        done = run_tool([path, "dump", "--pid", str(child.pid), "--nonblocking"], timeout=10)
        text = (done["stdout"] + done["stderr"]).strip()
        result["can_dump"] = done["returncode"] == 0
        if result["can_dump"]:
            result["detail"] = "py-spy dumped a test process"
        else:
            last = text.splitlines()[-1] if text else ""
            result["detail"] = (done["error"] or last or "py-spy failed")[:300]
    finally:
        child.kill()
        child.wait()
    return result


@dataclasses.dataclass
class AgentResult:
    """One node's answer to a fanned-out call."""

    node_id: str
    node_ip: str | None
    ok: bool
    value: Any = None
    error: str | None = None


def get_agents(*, timeout: float = 30.0) -> dict[str, Any]:
    """One agent handle per alive node (created on demand, then reused)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raysleuth import cluster

    if not ray.is_initialized():
        raise ClusterUnreachable("not connected to Ray", fix="connect first (raysleuth.cluster.connect)")
    handles = {}
    actor_class = ray.remote(NodeAgent)
    for node in cluster.nodes(alive_only=True):
        node_id = node["node_id"]
        name = AGENT_PREFIX + node_id[:16]
        try:
            handle = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            handle = actor_class.options(
                name=name,
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                max_concurrency=16,
                max_restarts=3,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            ).remote()
        handles[node_id] = (handle, node["node_ip"])
    return handles


def call_agents(method: str, *args: Any, timeout: float = 30.0, nodes: list[str] | None = None,
                per_node_args: dict[str, tuple] | None = None) -> list[AgentResult]:
    """Call ``method`` on every node's agent in parallel; partial results on timeout.

    ``per_node_args`` gives node-specific arguments (node_id -> args tuple);
    such nodes get those instead of ``args``.
    """
    import ray

    agents = get_agents(timeout=timeout)
    wanted = {node_id: value for node_id, value in agents.items() if nodes is None or node_id in nodes}
    refs = {}
    for node_id, (handle, _ip) in wanted.items():
        call_args = per_node_args.get(node_id, args) if per_node_args else args
        refs[node_id] = getattr(handle, method).remote(*call_args)
    deadline = time.monotonic() + timeout
    pending = list(refs.values())
    while pending and time.monotonic() < deadline:
        _ready, pending = ray.wait(pending, num_returns=len(pending), timeout=max(0.0, deadline - time.monotonic()))
    results = []
    for node_id, ref in refs.items():
        node_ip = wanted[node_id][1]
        if ref in pending:
            results.append(AgentResult(node_id, node_ip, False,
                                       error=f"no answer from the agent on {node_ip} within {timeout:g}s"))
            continue
        try:
            results.append(AgentResult(node_id, node_ip, True, value=ray.get(ref)))
        except Exception as error:
            results.append(AgentResult(node_id, node_ip, False, error=f"{type(error).__name__}: {str(error)[:300]}"))
    return results
