"""What a node agent reads to learn each worker's rank: start-up environments, Ray Train's logs, thread CPU.

Runs on the node (inside its agent); plain functions, called by
:class:`raysleuth.agents.NodeAgent` and tested on their own.
"""

from __future__ import annotations

import os
import time
from typing import Any


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
                if is_ray_worker(proc.cmdline()):
                    procs.append(proc)
            except psutil.Error:
                continue
    elif pids is None:
        procs = []
        for proc in psutil.process_iter(["cmdline"]):
            if is_ray_worker(proc.info.get("cmdline") or []):
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


def thread_times(pids: list[int]) -> dict[int, dict[int, dict[str, float]]]:
    """Per pid, per OS thread id: progress counters so far, read from ``/proc`` with no ptrace.

    ``cpu`` (user + system CPU seconds), ``switches`` (voluntary context switches: a thread that
    sleeps, waits on I/O or yields between steps switches every step; one blocked for good does not),
    ``preempted`` (involuntary switches: a spinning thread is preempted) and ``io`` (bytes the thread
    read and wrote through system calls: a checkpoint being written moves it, a spinning wait does not), and
    ``disk_wait``: 1.0 when the thread is in the kernel's uninterruptible wait (state ``D``: on a device, as
    in ``fsync``) at this read, else 0.0. Pids that are gone are
    left out; where ``/proc`` has no ``status`` (not Linux), psutil's CPU times alone.
    """
    found: dict[int, dict[int, dict[str, float]]] = {}
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in pids:
        try:
            found[pid] = _proc_counters(pid, ticks)
        except OSError:
            try:
                import psutil

                found[pid] = {thread.id: {"cpu": thread.user_time + thread.system_time}
                              for thread in psutil.Process(pid).threads()}
            except Exception:
                continue
    return found


def _proc_counters(pid: int, ticks: int) -> dict[int, dict[str, float]]:
    threads: dict[int, dict[str, float]] = {}
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            # the state at this read: D is the kernel's uninterruptible wait, on a device (fsync, a slow disk)
            counters = {"cpu": (int(fields[11]) + int(fields[12])) / ticks, "disk_wait": float(fields[0] == "D")}
            try:
                with open(f"/proc/{pid}/task/{name}/io") as handle:
                    moved = {key: int(value) for key, _, value in (line.partition(":") for line in handle)
                             if key in ("rchar", "wchar")}
                counters["io"] = moved.get("rchar", 0) + moved.get("wchar", 0)
            except (OSError, ValueError):
                pass  # another user's process: no io counters
            with open(f"/proc/{pid}/task/{name}/status") as handle:
                for line in handle:
                    if line.startswith("voluntary_ctxt_switches"):
                        counters["switches"] = int(line.split(":")[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        counters["preempted"] = int(line.split(":")[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended while we read
        threads[int(name)] = counters
    return threads


def is_ray_worker(cmdline: list[str]) -> bool:
    if not cmdline:
        return False
    first = cmdline[0]
    return first.startswith("ray::") or any("default_worker.py" in part for part in cmdline[:4])
