"""Progress, measured: what each process did over the capture window, from counters.

Pure logic. A process's *activity* is decided by evidence, and the signals
that decided it are kept in ``ProcessStack.progress``:

- ``working``: progress was seen: a progress counter moved (a heartbeat or
  step advanced, collectives completed, a Ray call on it finished or
  started), the key thread's frames changed between the samples, it moved
  a MiB of I/O, or it woke while in the kernel's wait on a device (state
  ``D``: an ``fsync`` longer than the window);
- ``active``: the key thread used CPU or woke up (voluntary context
  switches) at the same frames with no progress counter moving: a loop
  that sleeps between steps looks so, and so does a thread that spins
  while it waits. It is never counted as waiting; whether it is the cause
  of others' wait is the wait-for graph's question;
- ``waiting``: positive evidence of no progress: the same frames in both
  samples, no CPU, (almost) no wake-ups, no counter moved, blocked in a
  collective, ``ray.get`` or an awaited call;
- ``blocked``: the same evidence, blocked elsewhere (a lock, an event, a
  sleep that never ends, a socket);
- ``returned``: idle in Ray's task loop, no call running;
- None: no stack.

With one sample nothing is measured: py-spy's on-CPU flag stands in, and
the verdict says so.
"""

from __future__ import annotations

from typing import Any

from raysleuth.stacks.analysis import is_ray_idle, key_thread, wait_point
from raysleuth.stacks.model import Activity, ProcessStack

__all__ = ["IO_BYTES", "WAKEUPS_PER_SECOND", "WORKING_CPU_SECONDS", "classify", "thread_deltas"]

WORKING_CPU_SECONDS = 0.03
"""CPU a key thread must use between the samples to count as active (a blocked wait uses ~0)."""
LOOP_WAKEUPS_PER_SECOND = 0.75
"""The same for an asyncio event loop's thread: an idle loop with nothing scheduled sleeps in ``select``
without waking; a loop that polls (Ray Train's controller) wakes on every timer."""
IO_BYTES = 1 << 20
"""Bytes of I/O (read + written through system calls) by the key thread over the window that count as
progress: a checkpoint being written or a data set being read; a spinning wait moves none. A thread in the
kernel's wait on a device (state ``D`` at a read of its counters) that woke or ran over the window also makes
progress (its ``fsync`` completes I/O while moving no bytes through system calls)."""
WAKEUPS_PER_SECOND = 3.0
"""Voluntary context switches per second of the window that make a thread active: a loop that
sleeps between steps switches at least once a step; a thread blocked for good does not switch,
and a blocked ``ray.get`` wakes well under once a second (measured in bench/bench_verdicts.py)."""


def thread_deltas(before: dict[int, dict[str, float]] | None, after: dict[int, dict[str, float]] | None,
                  tid: int | None, seconds: float) -> dict[str, float] | None:
    """The key thread's counters over the window: ``cpu``, ``switches``, ``preempted``, ``io``, ``window``, and
    ``disk_wait``: at how many of the two reads (0-2) it was in the kernel's I/O wait (state ``D``)."""
    if not before or not after or tid is None or tid not in before or tid not in after:
        return None
    old, new = before[tid], after[tid]
    if isinstance(old, (int, float)):  # an older agent: CPU seconds only
        old, new = {"cpu": float(old)}, {"cpu": float(new)}
    deltas: dict[str, float] = {name: round(float(new[name]) - float(old[name]), 4) for name in ("cpu", "switches", "preempted", "io")
              if name in old and name in new}
    if "disk_wait" in old and "disk_wait" in new:  # a state, not a counter: of the two reads, how many found D
        deltas["disk_wait"] = float(old["disk_wait"]) + float(new["disk_wait"])
    deltas["window"] = round(seconds, 3)
    return deltas


def _counter_signals(process: ProcessStack) -> list[str]:
    """Signals of progress already attached to the process (heartbeats, collectives, Ray calls)."""
    return [signal for signal in process.progress
            if not signal.startswith(("cpu ", "woke ", "stack moved", "on CPU", "disk I/O wait"))
            and not signal.endswith("of I/O")]


def _is_active(counters: dict[str, Any] | None) -> list[str]:
    if not counters:
        return []
    window = max(float(counters.get("window") or 0.0), 0.1)
    found = []
    if float(counters.get("cpu") or 0.0) >= WORKING_CPU_SECONDS:
        found.append(f"cpu {counters['cpu']:.2f}s in {window:.1f}s")
    switches = counters.get("switches")
    rate = LOOP_WAKEUPS_PER_SECOND if counters.get("event_loop") else WAKEUPS_PER_SECOND
    if switches is not None and switches / window >= rate:
        found.append(f"woke {int(switches)} times in {window:.1f}s")
    return found


def classify(process: ProcessStack, samples: int = 2) -> Activity | None:
    """Decide ``process.activity`` from its evidence (and ``process.wait``); returns the activity."""
    if process.samples is not None:
        samples = min(samples, process.samples)  # its own second read or counters failed: one sample of it
    thread = key_thread(process)
    if thread is None:
        process.activity, process.wait = None, None
        return None
    wait = wait_point(thread)
    async_call = bool(process.task_name and process.event_loop)
    idle_loop = is_ray_idle(thread)
    progress = _counter_signals(process)
    if samples >= 2 and process.moved_frames:
        progress.append("stack moved between the samples")
    io_bytes = float((process.counters or {}).get("io") or 0)
    if samples >= 2 and io_bytes >= IO_BYTES:
        progress.append(f"{io_bytes / 2**20:.1f} MiB of I/O")
    active = _is_active(process.counters)
    disk_wait = int(float((process.counters or {}).get("disk_wait") or 0))
    if samples >= 2 and disk_wait and active and not progress:
        # in the kernel's wait on a device at a read, and it woke or ran over the window: its I/O completes bit by
        # bit (an fsync longer than the window moves no bytes through system calls). In D and never woken, it
        # stays blocked (a mount that hangs).
        progress.append(f"disk I/O wait (state D at {disk_wait} of 2 reads, {', '.join(active)})")
        active = []
    if samples < 2 and not thread.idle:
        active.append("on CPU in the one sample")
    process.progress = progress + active
    activity: Activity
    if progress:
        activity = "working"
    elif idle_loop and not async_call:
        activity = "returned"  # (a finished call's task name may lag in the State API)
    elif active:
        activity = "active"
    elif idle_loop:
        activity, wait = "waiting", wait or "an awaited call"  # an async actor's call awaits off the main thread
    elif wait is not None:
        activity = "waiting"
    else:
        activity = "blocked"
    process.activity, process.wait = activity, wait if activity in ("waiting", "active") else None
    return activity
