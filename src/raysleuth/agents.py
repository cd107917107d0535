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

    def oom_evidence(self, since: float | None = None) -> dict[str, Any]:
        """Kernel-log OOM kills (where permitted) and cgroup OOM counts on this node (issue 18)."""
        return oom_evidence(since)

    def read_files(self, paths: list[str], tail_bytes: int = 65536) -> dict[str, str | None]:
        """The tail of each local file (None when absent or unreadable): fatal-signal files, logs."""
        return read_files(paths, tail_bytes)

    def worker_logs(self, pids: list[int], lines: int = 200) -> dict[int, dict[str, Any]]:
        """Last lines of each pid's Ray worker ``.err``/``.out`` logs and raysleuth fatal file on this node."""
        return worker_logs(pids, lines)

    def ray_train_lines(self, lines: int = 50) -> list[str]:
        """Lines naming a ``world_rank`` from Ray Train's worker logs on this node (``logs/train/``)."""
        return ray_train_lines(lines)


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


_KERNEL_KILL_LINE = ("Killed process", "oom-kill:")


def _kernel_oom_kills() -> dict[str, Any]:
    """OOM-killer records from the kernel log; ``permitted`` False with the reason when it is closed to us."""
    import re

    tool = find_tool("dmesg")
    if tool is None:
        return {"permitted": False, "reason": "dmesg is not installed", "kills": []}
    done = run_tool([tool], timeout=5)
    if done["returncode"] != 0:
        reason = (done["stderr"] or done["error"] or "dmesg failed").strip().splitlines()
        return {"permitted": False, "reason": (reason[-1] if reason else "dmesg failed")[:200], "kills": []}
    kills = []
    for line in done["stdout"].splitlines():
        if not any(marker in line for marker in _KERNEL_KILL_LINE):
            continue
        match = re.search(r"Killed process (\d+) \(([^)]*)\)", line)
        if match:
            kills.append({"pid": int(match.group(1)), "name": match.group(2), "text": line.strip()[:400]})
    return {"permitted": True, "reason": None, "kills": kills}


def _read_int(path: str) -> int | None:
    try:
        with open(path) as handle:
            return int(handle.read().strip().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _cgroup_memory() -> dict[str, Any]:
    """This process's memory cgroup: its OOM-kill count and limit (cgroup v2 ``memory.events`` or v1)."""
    try:
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError as error:
        return {"error": str(error)}
    v1 = next((line.split(":", 2)[2] for line in lines if line.split(":")[1:2] == ["memory"]), None)
    v2 = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    candidates = []
    if v1 is not None:
        for base in (f"/sys/fs/cgroup/memory{v1}", "/sys/fs/cgroup/memory"):
            candidates.append(("v1", base, f"{base}/memory.oom_control", f"{base}/memory.limit_in_bytes"))
    if v2 is not None:
        for base in (f"/sys/fs/cgroup{v2}".rstrip("/"), "/sys/fs/cgroup"):
            candidates.append(("v2", base, f"{base}/memory.events", f"{base}/memory.max"))
    for version, base, events, limit in candidates:
        try:
            with open(events) as handle:
                counts = dict(line.split()[:2] for line in handle.read().splitlines() if len(line.split()) >= 2)
        except OSError:
            continue
        limit_bytes = _read_int(limit)
        if limit_bytes is not None and limit_bytes >= 2**60:
            limit_bytes = None  # "unlimited"
        return {"version": version, "path": base, "oom_kill": int(counts.get("oom_kill", 0) or 0),
                "oom": int(counts.get("oom", counts.get("under_oom", 0)) or 0), "cgroup_limit_bytes": limit_bytes}
    return {"error": "no readable memory cgroup (memory.events / memory.oom_control)"}


def oom_evidence(since: float | None = None) -> dict[str, Any]:
    """The node's OOM evidence: kernel-log kills and the memory cgroup's counts and limit."""
    import psutil

    cgroup = _cgroup_memory()
    total = psutil.virtual_memory().total
    limit = cgroup.get("cgroup_limit_bytes")
    cgroup["limit_bytes"] = min(limit, total) if limit else total
    return {"kernel_log": _kernel_oom_kills(), "cgroup": cgroup, "time": time.time()}


def read_files(paths: list[str], tail_bytes: int = 65536) -> dict[str, str | None]:
    """The last ``tail_bytes`` of each file, decoded leniently; None for a missing or unreadable one."""
    result: dict[str, str | None] = {}
    for path in paths:
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - tail_bytes))
                result[path] = handle.read().decode("utf-8", errors="replace")
        except OSError:
            result[path] = None
    return result


def worker_logs(pids: list[int], lines: int = 200, logs_dir: str | None = None) -> dict[int, dict[str, Any]]:
    """Per pid: ``err``/``out`` (last ``lines`` lines of ``worker-*-<pid>.err/.out``) and ``fatal``
    (``raysleuth-fatal-<pid>.log``), from this node's Ray session logs (and ``old/``, where Ray's log
    monitor moves dead workers' files); ``error`` when none was found."""
    from raysleuth import cluster

    folder = logs_dir or cluster.local_logs_dir()
    wanted = {int(pid) for pid in pids}
    files: dict[int, dict[str, str]] = {}
    try:
        names = os.listdir(folder) if folder else []
    except OSError as error:
        return {pid: {"error": f"cannot list {folder}: {error.strerror}"} for pid in wanted}
    try:  # Ray's log monitor moves dead workers' logs to old/ once it has many files open
        names = [os.path.join("old", name) for name in os.listdir(os.path.join(folder, "old"))] + names
    except OSError:
        pass
    for path in names:
        name = os.path.basename(path)
        stem, _, suffix = name.rpartition(".")
        if name.startswith("worker-") and suffix in ("err", "out"):
            pid = stem.rsplit("-", 1)[-1]
            if pid.isdigit() and int(pid) in wanted:
                files.setdefault(int(pid), {})[suffix] = os.path.join(folder, path)
        elif name.startswith("raysleuth-fatal-") and suffix == "log":
            pid = stem.removeprefix("raysleuth-fatal-")
            if pid.isdigit() and int(pid) in wanted:
                files.setdefault(int(pid), {})["fatal"] = os.path.join(folder, path)
    result: dict[int, dict[str, Any]] = {}
    for pid in wanted:
        found = files.get(pid)
        if not found:
            result[pid] = {"error": f"no worker log for pid {pid} in {folder}"}
            continue
        texts = read_files(list(found.values()), tail_bytes=max(4096, lines * 400))
        entry: dict[str, Any] = {}
        for key, path in found.items():
            text = texts.get(path)
            if text is None:
                continue
            entry[key] = text if key == "fatal" else text.splitlines()[-lines:]
        result[pid] = entry
    return result


def ray_train_lines(lines: int = 50, logs_dir: str | None = None) -> list[str]:
    """The last ``lines`` lines with a ``world_rank`` of each ``ray-train-sys-worker-*.log`` (JSON lines)."""
    from raysleuth import cluster

    folder = os.path.join(logs_dir or cluster.local_logs_dir() or "", "train")
    try:
        names = [name for name in os.listdir(folder) if name.startswith("ray-train-sys-worker")]
    except OSError:
        return []
    found: list[str] = []
    for text in read_files([os.path.join(folder, name) for name in names], tail_bytes=lines * 1200).values():
        found += [line for line in (text or "").splitlines() if '"world_rank"' in line][-lines:]
    return found
