"""What a node agent reads from its host: tools (py-spy), process memory, GPUs, OOM records, worker logs.

Runs on the node (inside its agent); plain functions, called by
:class:`raysleuth.agents.NodeAgent` and tested on their own.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from raysleuth import cluster


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


def run_tool(argv: list[str], timeout: float, interrupt_s: float = 0.0) -> dict[str, Any]:
    """Run ``argv`` with a timeout; never raises.

    On timeout the tool is killed, or first interrupted (SIGINT) when ``interrupt_s`` > 0 and given that long to
    write what it has: ``py-spy record`` writes the samples it took so far on Control-C. What it wrote comes back
    in ``stdout`` with ``timed_out`` set.
    """
    started = time.monotonic()
    try:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as error:
        return {"returncode": None, "stdout": "", "stderr": "", "timed_out": False,
                "error": str(error), "seconds": time.monotonic() - started}
    with child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
            return {"returncode": child.returncode, "stdout": stdout, "stderr": stderr,
                    "timed_out": False, "error": None, "seconds": time.monotonic() - started}
        except subprocess.TimeoutExpired:
            pass
        stdout, stderr = "", ""
        if interrupt_s > 0:
            child.send_signal(signal.SIGINT)
            try:
                stdout, stderr = child.communicate(timeout=interrupt_s)
            except subprocess.TimeoutExpired:
                pass
        if child.poll() is None:
            child.kill()
            stdout, stderr = child.communicate()  # all it wrote: a timed-out communicate keeps what it read
        return {"returncode": child.returncode, "stdout": stdout or "", "stderr": stderr or "", "timed_out": True,
                "error": f"timed out after {timeout:g}s" + (" (interrupted)" if interrupt_s > 0 else ""),
                "seconds": time.monotonic() - started}


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


_KERNEL_KILL_LINE = ("Killed process", "oom-kill:")
KERNEL_LOG_SLACK_S = 60.0
"""Kills logged up to this long before ``since`` are kept: the kernel's clock and the wall clock drift apart."""


def pid_namespace() -> dict[str, Any]:
    """Whether this process sees the kernel log's pids (``NSpid`` in ``/proc/self/status``).

    One entry: the initial pid namespace, where dmesg's pids are ours. More:
    a container's namespace; dmesg prints host pids, which are not Ray's.
    """
    try:
        with open("/proc/self/status") as handle:
            line = next((row for row in handle if row.startswith("NSpid:")), None)
    except OSError as error:
        return {"same_as_kernel_log": None, "detail": f"/proc/self/status unreadable: {error}"}
    if line is None:
        return {"same_as_kernel_log": None, "detail": "/proc/self/status has no NSpid line"}
    levels = len(line.split()) - 1
    return {"same_as_kernel_log": levels == 1, "levels": levels,
            "detail": "the initial pid namespace" if levels == 1 else
            f"a nested pid namespace ({levels} levels): the kernel log's pids are the host's, not these"}


def parse_kernel_kills(text: str, *, booted_at: float | None, since: float | None = None) -> list[dict[str, Any]]:
    """The OOM kills in dmesg output: pid, command name, wall time (from the ``[seconds]`` stamp), the line.

    ``booted_at``: wall time of the kernel clock's zero (None: times unknown).
    With ``since``, kills stamped before ``since - KERNEL_LOG_SLACK_S`` are
    left out (an old kill of a reused pid is not this death).
    """
    import re

    kills = []
    for line in text.splitlines():
        if not any(marker in line for marker in _KERNEL_KILL_LINE):
            continue
        match = re.search(r"Killed process (\d+) \(([^)]*)\)", line)
        if not match:
            continue
        stamp = re.match(r"\s*\[\s*(\d+(?:\.\d+)?)\]", line)
        when = booted_at + float(stamp.group(1)) if stamp and booted_at is not None else None
        if since is not None and when is not None and when < since - KERNEL_LOG_SLACK_S:
            continue
        kills.append({"pid": int(match.group(1)), "name": match.group(2), "time": when, "text": line.strip()[:400]})
    return kills


def _kernel_oom_kills(since: float | None = None) -> dict[str, Any]:
    """OOM-killer records from the kernel log; ``permitted`` False with the reason when it is closed to us."""
    namespace = pid_namespace()
    tool = find_tool("dmesg")
    if tool is None:
        return {"permitted": False, "reason": "dmesg is not installed", "kills": [], "pid_namespace": namespace}
    done = run_tool([tool], timeout=5)
    if done["returncode"] != 0:
        reason = (done["stderr"] or done["error"] or "dmesg failed").strip().splitlines()
        return {"permitted": False, "reason": (reason[-1] if reason else "dmesg failed")[:200], "kills": [],
                "pid_namespace": namespace}
    # dmesg stamps count from boot on the kernel's monotonic clock (suspend not counted)
    booted_at = time.time() - time.monotonic()
    return {"permitted": True, "reason": None, "since": since, "pid_namespace": namespace,
            "kills": parse_kernel_kills(done["stdout"], booted_at=booted_at, since=since)}


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
    """The node's OOM evidence: kernel-log kills (since ``since``, wall time) and the memory cgroup's counts and limit.

    Each kill carries its pid, command name and wall time; ``pid_namespace``
    says whether those pids are this node's view of the workers' pids.
    """
    import psutil

    cgroup = _cgroup_memory()
    total = psutil.virtual_memory().total
    limit = cgroup.get("cgroup_limit_bytes")
    cgroup["limit_bytes"] = min(limit, total) if limit else total
    return {"kernel_log": _kernel_oom_kills(since), "cgroup": cgroup, "time": time.time()}


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

    folder = logs_dir or cluster.local_logs_dir()
    wanted = {int(pid) for pid in pids}
    files: dict[int, dict[str, str]] = {}
    if not folder:  # not in a Ray process and no logs_dir given
        return {pid: {"error": "no Ray session logs folder in this process: pass logs_dir"} for pid in wanted}
    try:
        names = os.listdir(folder)
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
            digits = stem.rsplit("-", 1)[-1]
            if digits.isdigit() and int(digits) in wanted:
                files.setdefault(int(digits), {})[suffix] = os.path.join(folder, path)
        elif name.startswith("raysleuth-fatal-") and suffix == "log":
            digits = stem.removeprefix("raysleuth-fatal-")
            if digits.isdigit() and int(digits) in wanted:
                files.setdefault(int(digits), {})["fatal"] = os.path.join(folder, path)
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

    folder = os.path.join(logs_dir or cluster.local_logs_dir() or "", "train")
    try:
        names = [name for name in os.listdir(folder) if name.startswith("ray-train-sys-worker")]
    except OSError:
        return []
    found: list[str] = []
    for text in read_files([os.path.join(folder, name) for name in names], tail_bytes=lines * 1200).values():
        found += [line for line in (text or "").splitlines() if '"world_rank"' in line][-lines:]
    return found
