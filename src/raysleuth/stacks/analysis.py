"""Pure logic on stacks: parse py-spy JSON, pick key threads, group, judge.

No Ray and no I/O here: everything takes plain data, so it is unit tested
on hand-written stacks and reused by the cluster capture.

Rules (the reasoning behind the verdict):

- The **key threads** of a process are its main thread, any thread that
  runs a Ray task (it has Ray's ``actor_method_executor`` /
  ``function_executor`` frame), and any thread running the user's code:
  Ray Train's ``TrainingThread(...)``, or any thread with a frame outside
  installed packages. They are never folded: a rank blocked in a
  collective or ``ray.get`` looks "idle" to py-spy and is exactly what we
  look for. The thread that says what a process does is the key thread
  with user frames (a Ray Train worker: its training thread, not its main
  thread idle in Ray's task loop). Other threads are folded when idle.
- The **frames that matter** of a key thread are those above Ray's executor
  plumbing (``main_loop``, ``default_worker.py``); processes are grouped by
  them (function, file, line).
- The verdict's rules (peers, wait-for chains, dead peers, calls that did
  not return, hung or busy) live in :mod:`raysleuth.stacks.verdict`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from raysleuth.cluster.records import RayTask
from raysleuth.stacks.model import Frame, ProcessStack, StackGroup, ThreadStack, WaitLink

__all__ = [
    "group_processes",
    "has_event_loop",
    "has_user_frames",
    "headline",
    "is_library",
    "key_thread",
    "parse_py_spy",
    "signature",
    "wait_chains",
    "wait_point",
]

_EXECUTOR_FUNCTIONS = {"actor_method_executor", "function_executor", "_function_executor"}
_PLUMBING_FILES = ("ray/_private/function_manager.py", "ray/_private/worker.py", "ray/_private/workers/default_worker.py",
                   "ray/util/tracing/tracing_helper.py", "ray/_private/async_compat.py")
_LIBRARY = re.compile(
    r"(/site-packages/|/dist-packages/|/lib/python\d\.\d+/|^<frozen |/(?:src|site-packages)/raysleuth/|^<string>$)")
_RAY_WAITS = {("ray/_private/worker.py", "get"), ("ray/_private/worker.py", "wait")}
_TRAINING_THREAD = "TrainingThread("  # Ray Train runs the user's train function on this thread
_COLLECTIVE_FILES = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py")
_BACKWARD = ("torch/autograd/graph.py", "_engine_run_backward")
_DRIVER_TASK_PREFIX = "f" * 40


def _bare(function: str) -> str:
    """``Trainer.all_reduce`` -> ``all_reduce`` (py-spy gives qualified names on 3.11+)."""
    return function.rsplit(".", 1)[-1]


def is_library(frame: Frame) -> bool:
    """True for frames of installed packages, the standard library and raysleuth itself."""
    name = frame.file or ""
    if name.startswith("<") and name != "<string>":
        return True
    if not name.startswith("<") and not name.endswith((".py", ".pyx")):
        return True  # a native frame (--native): libc, libpython, an extension
    return bool(_LIBRARY.search(name)) and name != "<string>"


def parse_py_spy(raw: list[dict[str, Any]], *, pid: int) -> list[ThreadStack]:
    """Threads from ``py-spy dump --json`` output (innermost frame first)."""
    threads = []
    for entry in raw:
        frames = [
            Frame(function=item.get("name") or "?", file=item.get("filename") or "?", line=int(item.get("line") or 0),
                  short_file=item.get("short_filename") or "")
            for item in entry.get("frames") or []
        ]
        name = entry.get("thread_name") or f"thread {entry.get('os_thread_id') or entry.get('thread_id')}"
        is_main = entry.get("os_thread_id") == pid or name == "MainThread"
        is_task = any(_bare(frame.function) in _EXECUTOR_FUNCTIONS for frame in frames)
        if is_task:
            role = "task"
        elif is_main:
            role = "main"
        elif name.startswith(_TRAINING_THREAD) or any(not is_library(frame) for frame in frames):
            role = "training"  # the user's code runs here: never folded
        else:
            role = "background"
        threads.append(ThreadStack(
            name=name,
            thread_id=entry.get("thread_id"),
            os_thread_id=entry.get("os_thread_id"),
            idle=not entry.get("active", True),
            owns_gil=bool(entry.get("owns_gil")),
            role=role,
            frames=frames,
        ))
    # Main thread first, then task and training threads, then the rest (stable).
    order = {"main": 0, "task": 1, "training": 2, "background": 3}
    threads.sort(key=lambda thread: order[thread.role])
    return threads


def fold_threads(threads: list[ThreadStack], include_idle: bool) -> tuple[list[ThreadStack], int]:
    """Drop idle background threads (never main, task or training threads); returns (kept, folded count)."""
    if include_idle:
        return threads, 0
    kept = [thread for thread in threads if thread.role != "background" or not thread.idle]
    return kept, len(threads) - len(kept)


def has_event_loop(thread: ThreadStack) -> bool:
    """True when the thread runs an asyncio event loop (``asyncio/base_events.py``)."""
    return any(_short(frame).endswith("asyncio/base_events.py") for frame in thread.frames)


def has_user_frames(thread: ThreadStack) -> bool:
    """True when any frame of the thread is the user's code (not an installed package or the stdlib)."""
    return any(not is_library(frame) for frame in thread.frames)


def key_thread(process: ProcessStack) -> ThreadStack | None:
    """The thread that says what a process is doing.

    A key thread (task, training, main) running the user's code wins; then a
    Ray task thread; then Ray Train's training thread; then the main thread.
    """
    best, best_score = None, -1
    for thread in process.threads:
        if thread.role == "background":
            continue
        score = (4 if has_user_frames(thread) else 0) + {"task": 2, "training": 1, "main": 0}[thread.role]
        if score > best_score:
            best, best_score = thread, score
    return best or (process.threads[0] if process.threads else None)


def _short(frame: Frame) -> str:
    return frame.short_file or frame.file


def frames_that_matter(thread: ThreadStack) -> list[Frame]:
    """The thread's frames above Ray's executor plumbing (all frames when there is none).

    For a training thread (Ray Train's, or a user's own thread): the frames up
    to its outermost user frame (Ray Train's thread runner is plumbing).
    """
    frames = thread.frames
    if thread.role == "training":
        outer = max((index for index, frame in enumerate(frames) if not is_library(frame)), default=None)
        return frames[:outer + 1] if outer is not None else frames
    for index, frame in enumerate(frames):
        if _bare(frame.function) in _EXECUTOR_FUNCTIONS:
            kept = frames[:index]
            # Ray's own wrappers just above the executor (tracing, async compat) are plumbing too.
            while kept and any(_short(kept[-1]).endswith(name) for name in _PLUMBING_FILES[3:]):
                kept = kept[:-1]
            return kept or frames[index:index + 1]
    return frames


def signature(process: ProcessStack) -> tuple:
    """Grouping key: the key thread's frames that matter, as (function, file, line)."""
    thread = key_thread(process)
    if thread is None:
        return ("<no stack>", process.error or "")
    return tuple((frame.function, _short(frame), frame.line) for frame in frames_that_matter(thread))


def is_ray_idle(thread: ThreadStack) -> bool:
    """A worker's main thread in Ray's task loop with nothing running."""
    frames = thread.frames
    return bool(frames) and _bare(frames[0].function) == "main_loop" and _short(frames[0]).endswith("ray/_private/worker.py")


def awaits_off_main_thread(process: ProcessStack) -> bool:
    """An async actor whose main thread is idle in Ray's task loop: its calls' coroutines await on the event
    loop's thread, where what they await is not in the main thread's frames."""
    thread = key_thread(process)
    return bool(process.event_loop) and thread is not None and is_ray_idle(thread)


def in_ray_wait(thread: ThreadStack) -> bool:
    """The thread is blocked in ``ray.get`` or ``ray.wait``."""
    return _ray_wait(thread.frames[:8]) is not None


def _ray_wait(frames: list[Frame]) -> str | None:
    for frame in frames:
        if (_short(frame).split("site-packages/")[-1], _bare(frame.function)) in _RAY_WAITS:
            return f"ray.{_bare(frame.function)}"
    return None


def user_frame(frames: list[Frame]) -> tuple[Frame | None, list[Frame] | None]:
    """The innermost frame of the user's code, and the library frames inside it (if any)."""
    for index, frame in enumerate(frames):
        if not is_library(frame):
            return frame, (frames[:index] or None)
    return None, None


def _collective(frames: list[Frame]) -> str | None:
    """The torch.distributed call among these frames: ``all_reduce (torch.distributed)``."""
    found = None
    for frame in frames:
        short = _short(frame).split("site-packages/")[-1]
        if short == _COLLECTIVE_FILES[0] and not _bare(frame.function).startswith("_"):
            found = _bare(frame.function)  # keep the outermost: the call the user made
        elif (short, _bare(frame.function)) == _BACKWARD:
            found = found or "backward"
    if found == "backward":
        return "backward (torch.autograd: DDP's gradient all-reduce)"
    return f"{found} (torch.distributed)" if found else None


def wait_point(thread: ThreadStack | None) -> str | None:
    """Where an idle thread waits on others: a collective, or ``ray.get``/``ray.wait``; None elsewhere."""
    if thread is None or not thread.idle or not thread.frames:
        return None
    mine, inner = user_frame(frames_that_matter(thread))
    frames = inner if mine is not None else thread.frames
    if not frames:
        return None
    return _collective(frames) or _ray_wait(frames[:8])


def _callee_name(inner: list[Frame]) -> str:
    """What the user's frame called: a collective, ``ray.get``, else the outermost library frame above it."""
    waiting = _collective(inner) or _ray_wait(inner)
    if waiting:
        return waiting
    frame = inner[-1]
    if not (frame.file or "").endswith(".py"):
        return frame.function  # a native frame
    module = _short(frame).rsplit("/", 1)[-1].removesuffix(".py")
    return f"{module}.{frame.function}" if "." not in frame.function else frame.function


def headline(process: ProcessStack) -> str:
    """One line: where the key thread is (``waiting in all_reduce (trainer.py:88) → ray.get``)."""
    if process.error and not process.threads:
        return f"no stack: {process.error}"
    thread = key_thread(process)
    if thread is None:
        return "no Python threads"
    if is_ray_idle(thread):
        if process.task_name and process.event_loop:  # an async actor: its call waits off the main thread
            return f"idle in Ray's task loop while {process.task_name} awaits (async actor)"
        return "idle in Ray's task loop (nothing running)"
    frames = frames_that_matter(thread)
    mine, callee = user_frame(frames)
    verb = "waiting in" if thread.idle else "running"
    if mine is None:
        inner = frames[0] if frames else None
        return f"{verb} {inner.where}" if inner else f"{verb} <no frames>"
    text = f"{verb} {mine.where}"
    if callee is not None:
        text += f" → {_callee_name(callee)}"
    return text


def group_processes(processes: Iterable[ProcessStack]) -> list[StackGroup]:
    """Group processes with identical key-thread frames, most common first."""
    buckets: dict[tuple, list[ProcessStack]] = defaultdict(list)
    for process in processes:
        buckets[signature(process)].append(process)
    groups = []
    for members in buckets.values():
        first = members[0]
        thread = key_thread(first)
        ranks = sorted({member.rank for member in members if member.rank is not None})
        groups.append(StackGroup(
            count=len(members),
            pids=[member.pid for member in members],
            ranks=ranks,
            frames=frames_that_matter(thread) if thread else [],
            headline=headline(first),
            idle=bool(thread and thread.idle),
            actor_classes=sorted({member.actor_class for member in members if member.actor_class}),
            members=[(member.node_ip, member.pid) for member in members],
        ))
    groups.sort(key=lambda group: (-group.count, group.headline))
    return groups


def _link(process: ProcessStack) -> WaitLink:
    thread = key_thread(process)
    return WaitLink(pid=process.pid, node_ip=process.node_ip, role=process.role, actor_class=process.actor_class,
                    rank=process.rank, task_name=process.task_name, where=headline(process),
                    waiting=bool(thread and in_ray_wait(thread)))


def wait_chains(processes: list[ProcessStack], tasks: list[RayTask], *, max_depth: int = 8
                ) -> tuple[list[list[WaitLink]], list[ProcessStack]]:
    """Follow ``ray.get`` waits from each driver through the calls it submitted.

    ``tasks``: unfinished tasks from the State API (their records: task_id,
    parent_task_id, name, worker_pid, node_id). Returns the chains (one per distinct
    path, driver first) and the chain ends that are not waiting on anything.
    """
    by_worker = {(p.node_id, p.pid): p for p in processes}
    by_pid: dict[int, list[ProcessStack]] = defaultdict(list)
    for process in processes:
        by_pid[process.pid].append(process)
    children: dict[str, list[RayTask]] = defaultdict(list)
    for task in tasks:
        if task.parent_task_id:
            children[task.parent_task_id].append(task)

    def executor(task: RayTask) -> ProcessStack | None:
        pid = task.worker_pid
        if pid is None:
            return None
        found = by_worker.get((task.node_id, pid))
        if found is None and len(by_pid.get(pid, [])) == 1:
            found = by_pid[pid][0]
        return found

    chains: list[list[WaitLink]] = []
    ends: list[ProcessStack] = []
    seen_paths: set[tuple] = set()

    def follow(process: ProcessStack, own_task: str | None, path: list[ProcessStack], depth: int) -> None:
        thread = key_thread(process)
        calls = children.get(own_task or "", []) if thread is not None and in_ray_wait(thread) else []
        targets = []
        for call in calls:
            target = executor(call)
            if target is not None and target not in path:
                targets.append((call, target))
        if not targets or depth >= max_depth:
            if len(path) > 1:
                key = tuple((p.node_ip, p.pid) for p in path)
                if key not in seen_paths:
                    seen_paths.add(key)
                    chains.append([_link(p) for p in path])
                if path[-1] not in ends:
                    ends.append(path[-1])
            return
        for call, target in targets:
            target.task_name = target.task_name or call.name
            follow(target, call.task_id, path + [target], depth + 1)

    for process in processes:
        if process.role == "driver" and process.job_id:
            follow(process, _DRIVER_TASK_PREFIX + process.job_id, [process], 0)
    return chains, ends
