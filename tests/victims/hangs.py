"""Victims that hang: a collective with one straggler, a wait-for chain, a rank that stops heart-beating.

(a) :func:`start_collective_hang` — N ``Trainer`` actors meet at a
    ``Barrier`` actor; rank ``stuck_rank`` never arrives: it sleeps in
    :meth:`Trainer.load_batch`.
(b) ``python -m victims.hangs chain --address A`` — a driver blocked in
    ``ray.get`` on ``Coordinator.forward``, which waits on ``Worker.compute``,
    which sleeps in :func:`slow_compute`.
(c) :func:`start_heartbeat_stall` — ``Stepper`` ranks heartbeat every step;
    rank ``stall_rank`` stops at step ``stall_at`` in :meth:`Stepper.read_shard`.
"""

from __future__ import annotations

import asyncio
import sys
import time

import ray

HANG_SECONDS = 600


@ray.remote(num_cpus=0)
class Barrier:
    """A barrier for ``world`` ranks (an async actor: waits cost no thread)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.arrived: set[int] = set()
        self.event = asyncio.Event()

    async def wait(self, rank: int) -> int:
        self.arrived.add(rank)
        if len(self.arrived) >= self.world:
            self.event.set()
        await self.event.wait()
        return len(self.arrived)


@ray.remote(num_cpus=0)
class Trainer:
    """One rank of a collective-style job."""

    def __init__(self, rank: int, world: int, barrier, stuck_rank: int) -> None:
        import raysleuth as rs

        rs.set_rank(rank, world)
        self.rank, self.barrier, self.stuck_rank = rank, barrier, stuck_rank

    def pid(self) -> int:
        import os

        return os.getpid()

    def load_batch(self) -> None:
        time.sleep(HANG_SECONDS)  # the straggler: stuck reading data

    def all_reduce(self) -> int:
        return ray.get(self.barrier.wait.remote(self.rank))

    def train_step(self) -> int:
        if self.rank == self.stuck_rank:
            self.load_batch()
        return self.all_reduce()


def start_collective_hang(world: int = 4, stuck_rank: int = 2, *, node_ids: list[str] | None = None):
    """Start (a); returns (barrier, trainers, refs). Kill them with :func:`kill`."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    barrier = Barrier.remote(world)
    trainers = []
    for rank in range(world):
        options = {"name": f"trainer_rank{rank}"}
        if node_ids:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_ids[rank % len(node_ids)], soft=False)
        trainers.append(Trainer.options(**options).remote(rank, world, barrier, stuck_rank))
    pids = ray.get([t.pid.remote() for t in trainers], timeout=120)
    refs = [t.train_step.remote() for t in trainers]
    return barrier, trainers, refs, pids


@ray.remote(num_cpus=0)
class Worker:
    def pid(self) -> int:
        import os

        return os.getpid()

    def compute(self) -> int:
        return slow_compute()


def slow_compute() -> int:
    time.sleep(HANG_SECONDS)
    return 0


@ray.remote(num_cpus=0)
class Coordinator:
    def __init__(self, worker) -> None:
        self.worker = worker

    def forward(self) -> int:
        return ray.get(self.worker.compute.remote())


@ray.remote(num_cpus=0)
class Stepper:
    """A rank that heartbeats every step; ``stall_rank`` stops at ``stall_at``."""

    def __init__(self, rank: int, world: int) -> None:
        import raysleuth as rs

        rs.set_rank(rank, world)
        self.rank = rank

    def pid(self) -> int:
        import os

        return os.getpid()

    def read_shard(self) -> None:
        time.sleep(HANG_SECONDS)

    def run(self, steps: int, stall_rank: int, stall_at: int, step_seconds: float = 0.1) -> int:
        import raysleuth as rs

        for number in range(steps):
            with rs.step(number):
                if self.rank == stall_rank and number == stall_at:
                    self.read_shard()
                time.sleep(step_seconds)
        return steps


def start_heartbeat_stall(world: int = 3, stall_rank: int = 1, stall_at: int = 3, steps: int = 600):
    """Start (c); returns (steppers, refs, pids)."""
    steppers = [Stepper.options(name=f"stepper_rank{rank}").remote(rank, world) for rank in range(world)]
    pids = ray.get([s.pid.remote() for s in steppers], timeout=120)
    refs = [s.run.remote(steps, stall_rank, stall_at) for s in steppers]
    return steppers, refs, pids


def kill(*actors) -> None:
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:
            pass


def _chain(address: str) -> None:
    ray.init(address=address, log_to_driver=False)
    worker = Worker.remote()
    coordinator = Coordinator.remote(worker)
    print("worker-pid", ray.get(worker.pid.remote()), flush=True)
    ray.get(coordinator.forward.remote())


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "chain" and sys.argv[2] == "--address":
        _chain(sys.argv[3])
    else:
        sys.exit("usage: python -m victims.hangs chain --address ip:port")


@ray.remote(num_cpus=0)
class Spawner:
    """An actor with a subprocess of its own (as a DataLoader worker would be)."""

    def __init__(self) -> None:
        self.child = None

    def spawn(self) -> tuple[int, int]:
        import os
        import subprocess

        self.child = subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(600)"])
        return os.getpid(), self.child.pid

    def __del__(self) -> None:
        if self.child is not None:
            self.child.kill()
