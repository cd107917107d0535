"""Jobs of the shapes the verdict must judge, written the way users write them (no raysleuth inside).

Run as its own driver: ``python -m victims.verdict_shapes SHAPE --address ADDR [--hook]``; it prints
``ready <job id>`` once the shape is in place and then keeps it so until killed. ``--hook`` gives Ray
raysleuth's worker setup hook, as ``raysleuth run`` does (the job's code is unchanged).

Shapes (faults and their healthy twins):

- ``async_stuck`` / ``async_healthy``: an async rollout engine (one async actor serving ``generate()``
  requests, the shape of vLLM's AsyncLLM behind an agent loop); in ``async_stuck`` one request awaits an
  ``asyncio.Event`` nobody sets, and the driver waits on every request;
- ``cycle``: two actors waiting on each other: the learner calls ``ray.get(server.apply.remote())`` and
  the server calls back ``ray.get(learner.ack.remote())`` while the learner runs one call at a time;
- ``blocked_call``: the driver waits on one actor call blocked on a ``threading.Event`` nobody sets;
- ``ddp_sleep``: a healthy gloo DDP job whose loop sleeps 50 ms after each step;
- ``spin``: a gloo job whose rank 1 spins on a flag nobody sets (busy, no progress) while its peers wait
  in ``all_reduce``;
- ``op_mismatch``: ranks 0 and 2 call ``all_reduce`` while rank 1 calls ``broadcast``;
- ``checkpoint``: a healthy gloo job whose rank 0 writes a checkpoint for about 8 s every few steps while
  its peers wait in a barrier.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import tempfile
import time

import ray


def ready() -> None:
    print("ready", ray.get_runtime_context().get_job_id(), flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------- async engine

@ray.remote(num_cpus=0)
class RolloutEngine:
    """An async engine: each request is a coroutine; a stuck one awaits an event nobody sets."""

    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def generate(self, prompt: str, stuck: bool = False) -> str:
        await asyncio.sleep(0.05)  # "decode"
        if stuck:
            await self.never.wait()
        return prompt[::-1]


def async_engine(stuck: bool) -> None:
    engine = RolloutEngine.remote()
    ray.get(engine.generate.remote("warm up"))
    ready()
    while True:
        requests = [engine.generate.remote(f"prompt {i}", stuck=stuck and i == 3) for i in range(8)]
        ray.get(requests)


# ---------------------------------------------------------------- actor cycle

@ray.remote(num_cpus=0)
class ParamServer:
    def apply(self, learner) -> int:
        return ray.get(learner.ack.remote())  # calls back into the learner, which is busy calling us


@ray.remote(num_cpus=0, max_concurrency=1)
class Learner:
    def __init__(self, server) -> None:
        self.server = server

    def ack(self) -> int:
        return 1

    def train(self, me) -> int:
        return ray.get(self.server.apply.remote(me))


def cycle() -> None:
    server = ParamServer.remote()
    learner = Learner.remote(server)
    run = learner.train.remote(learner)
    time.sleep(1)
    ready()
    ray.get(run)


# ---------------------------------------------------------------- one blocked call

@ray.remote(num_cpus=0)
class Loader:
    """Loads a shard from a queue the producer never fills: blocked in the user's code, waited on."""

    def __init__(self) -> None:
        import threading

        self.filled = threading.Event()

    def pid(self) -> int:
        return os.getpid()

    def load(self) -> int:
        self.filled.wait()  # nobody sets it
        return 1


def blocked_call() -> None:
    loader = Loader.remote()
    ray.get(loader.pid.remote())
    run = loader.load.remote()
    time.sleep(1)
    ready()
    ray.get(run)


# ---------------------------------------------------------------- gloo jobs

@ray.remote(num_cpus=0)
class DDPWorker:
    def __init__(self, rank: int, world: int, port: int) -> None:
        import torch.distributed as dist

        self.rank = rank
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    def ping(self) -> int:
        return self.rank

    def train(self, shape: str, seconds: float = 3600.0) -> int:
        import torch
        import torch.distributed as dist

        model = torch.nn.Linear(16, 16)
        step, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            if shape == "spin" and self.rank == 1 and step == 3:
                flag = {"set": False}
                while not flag["set"]:  # waits for a flag nobody sets, on CPU
                    pass
            if shape == "op_mismatch" and step == 3:
                grad = torch.ones(4)
                if self.rank == 1:
                    dist.broadcast(grad, src=0)
                else:
                    dist.all_reduce(grad)
            loss = model(torch.randn(8, 16)).sum()
            loss.backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
            if shape == "checkpoint" and step % 4 == 2:
                if self.rank == 0:
                    self._checkpoint(model)
                dist.barrier()
            if shape == "ddp_sleep":
                time.sleep(0.05)
            step += 1
        return step

    def _checkpoint(self, model) -> None:
        import torch

        state = {"weights": torch.randn(256, 1024)}  # 1 MiB, written over and over for about 8 s
        with tempfile.TemporaryDirectory() as folder:
            until = time.monotonic() + 8.0
            while time.monotonic() < until:
                torch.save(state, os.path.join(folder, "ckpt.pt"))
                with open(os.path.join(folder, "ckpt.pt"), "rb") as handle:
                    os.fsync(handle.fileno())


def gloo(shape: str, workers: int = 3) -> None:
    port = free_port()
    ranks = [DDPWorker.options(name=f"ddp_rank{rank}", runtime_env={"env_vars": {"RANK": str(rank)}})
             .remote(rank, workers, port) for rank in range(workers)]
    ray.get([worker.ping.remote() for worker in ranks])  # the process group is up
    runs = [worker.train.remote(shape) for worker in ranks]
    time.sleep(3)
    ready()
    ray.get(runs)


SHAPES = {
    "async_stuck": lambda: async_engine(True),
    "async_healthy": lambda: async_engine(False),
    "cycle": cycle,
    "blocked_call": blocked_call,
    "ddp_sleep": lambda: gloo("ddp_sleep"),
    "spin": lambda: gloo("spin"),
    "op_mismatch": lambda: gloo("op_mismatch"),
    "checkpoint": lambda: gloo("checkpoint"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("--address", required=True)
    parser.add_argument("--hook", action="store_true", help="give Ray raysleuth's worker setup hook")
    args = parser.parse_args()
    runtime_env = {"worker_process_setup_hook": "raysleuth.setup_worker"} if args.hook else None
    ray.init(address=args.address, log_to_driver=False, runtime_env=runtime_env)
    SHAPES[args.shape]()


if __name__ == "__main__":
    main()
