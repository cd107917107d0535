"""Victims for task forensics and timelines: tasks that wait, hang, fail and actors that die."""

from __future__ import annotations

import os
import time

import ray


@ray.remote(num_gpus=1, num_cpus=0)
def needs_gpu() -> int:
    """Infeasible on a CPU-only cluster."""
    return 1


@ray.remote(num_cpus=0)
def never_finishes(seconds: float = 600.0) -> int:
    """An upstream that does not finish (within the test)."""
    time.sleep(seconds)
    return 1


@ray.remote(num_cpus=0)
def downstream(value: int) -> int:
    """Waits for its argument."""
    return value + 1


@ray.remote(num_cpus=0)
def fails() -> None:
    """Raises, so the task is FAILED."""
    raise ValueError("victim task failed on purpose")


#: What gloo says when a peer dies: its bracketed source path once crashed `raysleuth tasks` (rich markup).
GLOO_PEER_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Connection closed by "
                    "peer [127.0.0.1]:29500")


@ray.remote(num_cpus=0)
def fails_like_gloo() -> None:
    """Raises gloo's error text, so the task is FAILED with brackets in its message."""
    raise RuntimeError(GLOO_PEER_CLOSED)


@ray.remote(num_cpus=0, max_concurrency=4)
class Worker:
    """A ranked actor whose calls take as long as they are told."""

    def __init__(self, rank: int | None = None) -> None:
        if rank is not None:
            import raysleuth as rs

            rs.set_rank(rank)

    def pid(self) -> int:
        return os.getpid()

    def work(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def step(self, step: int, seconds: float) -> int:
        """One training step with phases, recorded as spans."""
        import raysleuth as rs

        with rs.span("train_step", step=step):
            with rs.span("forward", step=step):
                time.sleep(seconds)
            rs.event("loss", value=1.0 / (step + 1))
            self.backward(seconds)
        return step

    def backward(self, seconds: float) -> None:
        import raysleuth as rs

        @rs.trace(name="backward")
        def run() -> None:
            time.sleep(seconds)

        run()

    def flush(self) -> bool:
        """Record that this worker is ready and deliver its evidence now."""
        import raysleuth as rs
        from raysleuth.recorder import get_client

        rs.event("worker_ready")

        return get_client().flush(10.0)
