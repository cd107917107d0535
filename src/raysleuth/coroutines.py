"""What an async actor's coroutines await, read without the event loop's help.

py-spy sees an async actor's threads idle in the event loop (``select``)
while one of its requests awaits forever: coroutines are not frames of any
thread. This instrument runs in the worker (installed by the zero-code
setup, :func:`install`) and reads every pending ``asyncio`` task from the
control thread, never from the loop: the loop may be the thing that is
stuck. For each task it walks the await chain, coroutine frame by
coroutine frame, down to what the innermost one awaits (a future, an
``asyncio.Event``, a queue, a lock, another task), and remembers since when
the task has waited at that same point, so a listing says "awaited
``Event.wait`` at engine.py:31 for 42 s".

- every control tick (about once a second) :func:`track` refreshes the
  waiting-since table (cheap: nothing is done when no task is pending);
- on the control key ``coroutines.dump`` (``raysleuth stacks`` sets it) the
  process writes one ``coroutines`` record: its pending tasks with their
  await chains and waited seconds.

Reading another thread's tasks is not what asyncio promises: the task set
can change while it is copied (retried), a coroutine can move on while its
chain is walked (the chain is then cut short). Errors never reach the job.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
import weakref
from typing import Any

__all__ = ["CONTROL_KEY", "describe_task", "install", "pending_tasks", "snapshot", "track"]

CONTROL_KEY = "coroutines.dump"
MAX_TASKS = 2000
"""At most this many tasks are listed per process (the oldest waits first)."""
MAX_DEPTH = 24

_log = logging.getLogger("raysleuth.coroutines")
_since: dict[int, tuple[tuple, float, Any]] = {}
"""``id(task) -> (its frames' lines, first time seen there, a weak reference to the future it awaited)``: a
loop that awaits a new future each round (``asyncio.sleep`` in a poll) moves on, even at the same line and
when the new future reuses the old one's address."""
_lock = threading.Lock()
_installed = False


def pending_tasks() -> list[asyncio.Task]:
    """Every unfinished ``asyncio`` task of every loop of this process, read from any thread."""
    holders = [getattr(asyncio.tasks, name, None) for name in ("_all_tasks", "_scheduled_tasks")]
    for _attempt in range(5):
        try:
            found: dict[int, asyncio.Task] = {}
            for holder in holders:
                for task in list(holder or ()):
                    found[id(task)] = task
            return [task for task in found.values() if not task.done()]
        except RuntimeError:  # the set changed size while it was copied: read it again
            continue
    return []


def _frame_of(awaitable: Any) -> Any:
    for name in ("cr_frame", "gi_frame", "ag_frame"):
        frame = getattr(awaitable, name, None)
        if frame is not None:
            return frame
    return None


def _next_of(awaitable: Any) -> Any:
    for name in ("cr_await", "gi_yieldfrom", "ag_await"):
        if hasattr(awaitable, name):
            return getattr(awaitable, name)
    if isinstance(awaitable, asyncio.Future):
        return None
    # A compiled await wrapper (Cython's, around Ray's async actor calls) exposes nothing: the coroutine
    # it drives is among the objects it refers to.
    inner = [obj for obj in gc.get_referents(awaitable) if _frame_of(obj) is not None or
             type(obj).__name__ in ("coroutine", "generator", "async_generator")]
    return inner[0] if len(inner) == 1 else None


def describe_task(task: asyncio.Task) -> dict[str, Any]:
    """A task's await chain: coroutine frames outermost first, and what the innermost one awaits."""
    frames: list[dict[str, Any]] = []
    awaitable: Any = task.get_coro()
    awaited, awaited_id = None, None
    for _depth in range(MAX_DEPTH):
        frame = _frame_of(awaitable)
        following = _next_of(awaitable)
        if frame is None and following is None:
            if awaitable is not None:
                awaited, awaited_id = _awaited_name(awaitable), id(awaitable)
            break
        if frame is not None:  # (a compiled coroutine, Ray's wrapper among them, has no frame: walk through it)
            code = frame.f_code
            frames.append({"function": getattr(code, "co_qualname", code.co_name), "file": code.co_filename,
                           "line": frame.f_lineno})
        if following is None:
            break
        awaitable = following
    waiter = getattr(task, "_fut_waiter", None)
    if waiter is not None:
        awaited_id = id(waiter)
        awaited = awaited or _awaited_name(waiter)
    if frames and "/asyncio/" in frames[-1]["file"]:
        awaited = f"asyncio {frames[-1]['function']}"  # Event.wait, Queue.get, Lock.acquire, sleep...
    return {"task": task.get_name(), "frames": frames, "awaits": awaited,
            "point": [tuple((f["file"], f["line"]) for f in frames), waiter if waiter is not None else awaited_id]}


def _awaited_name(obj: Any) -> str:
    if isinstance(obj, asyncio.Task):
        return f"task {obj.get_name()}"
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__


def _ref(waiter: Any) -> Any:
    if waiter is None or isinstance(waiter, int):
        return waiter
    try:
        return weakref.ref(waiter)
    except TypeError:
        return id(waiter)


def _same(kept: Any, waiter: Any) -> bool:
    if isinstance(kept, weakref.ref):
        return kept() is waiter
    return kept == (waiter if waiter is None or isinstance(waiter, int) else id(waiter))


def track(now: float | None = None) -> list[dict[str, Any]]:
    """Refresh the waiting-since table from the pending tasks; returns their descriptions (with ``waited_s``)."""
    now = time.time() if now is None else now
    described = []
    tasks = pending_tasks()
    with _lock:
        alive = set()
        for task in tasks[:MAX_TASKS]:
            try:
                item = describe_task(task)
            except Exception:
                continue
            key = id(task)
            alive.add(key)
            where, waiter = item.pop("point")
            seen = _since.get(key)
            if seen is None or seen[0] != where or not _same(seen[2], waiter):
                seen = (where, now, _ref(waiter))
                _since[key] = seen
            item["waited_s"] = round(now - seen[1], 3)
            described.append(item)
        for key in set(_since) - alive:
            del _since[key]
    described.sort(key=lambda item: -item["waited_s"])
    return described


def snapshot() -> dict[str, Any]:
    """This process's pending tasks, longest waiting first (the ``coroutines`` record's data)."""
    tasks = track()
    return {"pid": os.getpid(), "time": time.time(), "tasks": tasks, "count": len(tasks),
            "tracked_since": _started}


_started: float | None = None


def _tick() -> bool:
    try:
        if _since or pending_tasks():
            track()
    except Exception:
        pass
    return False  # keep ticking


def _on_request(value: Any) -> None:
    if value is None:
        return
    try:
        # lazy: installed in every worker: the recorder and control thread load on install or request
        from raysleuth.recorder import record

        data = snapshot()
        data["request"] = value
        record("coroutines", data, name="request", level="INFO")
    except Exception:
        _log.debug("raysleuth coroutines dump failed", exc_info=True)


def install() -> bool:
    """Track this process's coroutines on the control thread and answer ``coroutines.dump`` (idempotent)."""
    global _installed, _started
    if _installed:
        return True
    # lazy: installed in every worker: the recorder and control thread load on install or request
    from raysleuth import control

    _installed, _started = True, time.time()
    control.on_tick(_tick)
    control.register(CONTROL_KEY, _on_request)
    return True
