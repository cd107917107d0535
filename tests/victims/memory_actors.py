"""Victims for the memory tests: a leaking worker, flat ones, and one that knows nothing of raysleuth.

``MemoryWorker`` runs ``steps`` training-like steps with ``rs.memory.watch``
on: ``leak`` appends a touched buffer every step (the leak), ``noisy``
maps and unmaps random-size buffers (noise without a trend), else it
only burns a little CPU. ``PlainGrower`` imports nothing from raysleuth and
grows from a background thread, for sampling by the node agents.
"""

from __future__ import annotations

import mmap
import random
import threading
import time

import ray

MiB = 1024 * 1024


@ray.remote(num_cpus=0.1)
class MemoryWorker:
    def __init__(self, rank: int, behaviour: str) -> None:
        import raysleuth as rs

        rs.set_rank(rank, 4)
        self.behaviour = behaviour
        self.buffers: list[bytes] = []
        self.pid = __import__("os").getpid()

    def run(self, steps: int, step_seconds: float, interval: float, mib_per_step: int = 2) -> dict:
        import raysleuth as rs
        from raysleuth import runtime

        sampler = rs.memory.watch(interval=interval)
        rng = random.Random(self.pid)
        for step in range(steps):
            runtime.set_step(step)
            if self.behaviour == "leak":
                self.buffers.append(b"x" * (mib_per_step * MiB))
            elif self.behaviour == "noisy":
                # scratch from its own mapping, returned whole on close: through malloc, glibc raises its
                # mmap threshold after the first big free and then keeps freed pages resident, so the
                # process would really stay up to ~2x the largest scratch higher (a floor that climbs)
                scratch = mmap.mmap(-1, max(1, rng.randint(0, 12)) * MiB)
                for offset in range(0, len(scratch), 4096):
                    scratch[offset] = 1
                time.sleep(step_seconds * rng.random())
                scratch.close()
            time.sleep(step_seconds)
        rs.memory.stop()
        from raysleuth.recorder import get_client

        flushed = get_client().flush(timeout=30)
        return {"pid": self.pid, "samples": sampler.samples, "errors": sampler.errors, "flushed": flushed}


@ray.remote(num_cpus=0.1)
class PlainGrower:
    """Grows ``mib`` MiB every ``tick`` seconds from a thread; no raysleuth import anywhere."""

    def __init__(self) -> None:
        self.buffers: list[bytes] = []
        self.stop_event = threading.Event()

    def start(self, mib: int, tick: float, limit: int) -> int:
        def grow() -> None:
            while not self.stop_event.is_set() and len(self.buffers) < limit:
                self.buffers.append(b"z" * (mib * MiB))
                time.sleep(tick)

        threading.Thread(target=grow, daemon=True).start()
        return __import__("os").getpid()

    def stop(self) -> int:
        self.stop_event.set()
        return len(self.buffers)

    def imported_raysleuth(self) -> bool:
        import sys

        return any(name == "raysleuth" or name.startswith("raysleuth.") for name in sys.modules)
