"""Real jobs, written the way users write them (no raysleuth inside), each run as its own driver.

``python -m victims.real_jobs KIND --address A [options]``, KIND one of:

- ``gloo`` — N Ray actors doing plain torch.distributed DDP with gloo on
  CPU; each actor's rank comes from ``runtime_env={"env_vars": {"RANK":
  ...}}``. ``--stuck-rank R`` blocks rank R in its data loader before the
  collective; ``--die-rank R`` makes rank R's process die (SIGKILL, as the
  kernel's OOM killer does) in the middle of training. The driver waits in
  ``ray.get`` on one ``train`` call per rank (the shape of every training
  driver).
- ``ps`` — synchronous data parallelism through a parameter-server actor
  (Ray's docs pattern): each rank pushes its gradient and waits in
  ``ray.get`` for the average; ``--die-rank R`` SIGKILLs rank R mid-run,
  so its peers wait forever.
- ``train`` — Ray Train ``TorchTrainer`` (v2) with gloo on CPU, as Ray's
  docs teach; ``--stuck-rank R`` blocks world rank R fetching a batch.
- ``verl`` — a verl ``RayWorkerGroup`` (CPU settings of REAL_JOBS.md);
  ``--stuck-rank R`` never returns from ``generate_sequences``; without it
  the driver calls a busy ``train_step`` on every rank, step after step.

Each prints ``ready <job id>`` once its ranks run. Options: ``--workers N``,
``--seconds S`` (how long a healthy job trains).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
import time

import ray

HANG_SECONDS = 600


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ----------------------------------------------------------------- gloo DDP actors

@ray.remote(num_cpus=0)
class DDPRank:
    """One rank of a plain DDP job: the process group is joined in __init__."""

    def __init__(self, port: int) -> None:
        import torch
        import torch.distributed as dist

        self.rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=self.rank, world_size=world)
        self.metrics_group = dist.new_group(backend="gloo")  # a second process group, for metrics
        torch.manual_seed(0)
        self.model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def pid(self) -> int:
        return os.getpid()

    def next_batch(self, step: int, stuck: bool):
        import torch

        if stuck:
            time.sleep(HANG_SECONDS)  # the data loader never yields
        return torch.randn(32, 64)

    def train(self, seconds: float, stuck_rank: int = -1, raise_rank: int = -1, swap_rank: int = -1) -> int:
        import torch
        import torch.distributed as dist

        step, deadline = 0, time.time() + seconds
        while time.time() < deadline:
            batch = self.next_batch(step, stuck=self.rank == stuck_rank and step == 3)
            loss = self.model(batch).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()  # DDP all-reduces the gradients here
            self.optimizer.step()
            if self.rank == raise_rank and step == 3:
                raise FloatingPointError(f"loss is nan on rank {self.rank}")
            loss, tokens = loss.detach(), torch.ones(1)
            if self.rank == swap_rank and step == 3:
                dist.all_reduce(tokens, group=self.metrics_group)  # the wrong order: a deadlock
                dist.all_reduce(loss)
            else:
                dist.all_reduce(loss)  # the loss, for logging
                dist.all_reduce(tokens, group=self.metrics_group)
            step += 1
            time.sleep(0.02)
        return step


def run_gloo(workers: int, seconds: float, stuck_rank: int, raise_rank: int = -1, swap_rank: int = -1) -> None:
    port = free_port()
    ranks = [DDPRank.options(runtime_env={"env_vars": {"RANK": str(rank), "WORLD_SIZE": str(workers)}}).remote(port)
             for rank in range(workers)]
    ray.get([rank.pid.remote() for rank in ranks], timeout=300)
    refs = [rank.train.remote(seconds, stuck_rank, raise_rank, swap_rank) for rank in ranks]
    ready()
    wait_for_ranks(refs)


def ready() -> None:
    print("ready", ray.get_runtime_context().get_job_id(), flush=True)


def wait_for_ranks(refs) -> None:
    """The driver: report each rank as it finishes; a rank that failed is reported, the others go on."""
    while refs:
        done, refs = ray.wait(refs)
        for ref in done:
            try:
                print("steps", ray.get(ref), flush=True)
            except ray.exceptions.RayError as error:
                print("a rank failed:", str(error).splitlines()[0], flush=True)


# ----------------------------------------------------------------- parameter server

@ray.remote(num_cpus=0)
class ParameterServer:
    """Averages one gradient per rank per step; a rank's push returns once every rank pushed."""

    def __init__(self, world: int) -> None:
        import asyncio

        self.world, self.asyncio = world, asyncio
        self.pushed: dict[int, list] = {}
        self.done: dict[int, asyncio.Event] = {}

    async def push(self, step: int, rank: int, gradient: float) -> float:
        self.pushed.setdefault(step, []).append(gradient)
        event = self.done.setdefault(step, self.asyncio.Event())
        if len(self.pushed[step]) == self.world:
            event.set()
        await event.wait()
        return sum(self.pushed[step]) / self.world


@ray.remote(num_cpus=0)
class PSWorker:
    """One data-parallel rank (its rank from RANK in its environment)."""

    def __init__(self, server) -> None:
        self.rank, self.server = int(os.environ["RANK"]), server

    def pid(self) -> int:
        return os.getpid()

    def train(self, seconds: float, die_rank: int = -1) -> int:
        import torch

        weight, step, deadline = torch.zeros(64), 0, time.time() + seconds
        while time.time() < deadline:
            gradient = float((torch.randn(32, 64) @ weight.add(1.0)).mean())
            if self.rank == die_rank and step == 3:
                os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
            average = ray.get(self.server.push.remote(step, self.rank, gradient))
            weight -= 0.01 * average
            step += 1
            time.sleep(0.02)
        return step


def run_ps(workers: int, seconds: float, die_rank: int) -> None:
    server = ParameterServer.remote(workers)
    ranks = [PSWorker.options(runtime_env={"env_vars": {"RANK": str(rank), "WORLD_SIZE": str(workers)}}).remote(server)
             for rank in range(workers)]
    ray.get([rank.pid.remote() for rank in ranks], timeout=300)
    refs = [rank.train.remote(seconds, die_rank) for rank in ranks]
    ready()
    wait_for_ranks(refs)


# ----------------------------------------------------------------- verl

def run_verl(workers: int, seconds: float, stuck_rank: int) -> None:
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    from victims.verl_victims import ToyWorker

    pool = RayResourcePool(process_on_nodes=[workers], use_gpu=False, max_colocate_count=1)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(ToyWorker)), device_name="cpu")
    group.ping()
    ready()
    if stuck_rank >= 0:
        ray.get(group.generate_sequences(stuck_rank, HANG_SECONDS))  # rank R never returns
    deadline = time.time() + seconds
    while time.time() < deadline:  # healthy: the driver waits on busy calls, step after step
        group.train_step(1.0)


# ----------------------------------------------------------------- Ray Train

def fetch_batch(step: int, stuck: bool):
    import torch

    if stuck:
        time.sleep(HANG_SECONDS)  # a shard that never arrives
    return torch.randn(32, 64)


def train_loop_per_worker(config: dict) -> None:
    import torch

    import ray.train
    import ray.train.torch

    model = ray.train.torch.prepare_model(torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rank = ray.train.get_context().get_world_rank()
    step, deadline = 0, time.time() + config["seconds"]
    while time.time() < deadline:
        batch = fetch_batch(step, stuck=rank == config["stuck_rank"] and step == 3)
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        time.sleep(0.02)


def run_train(workers: int, seconds: float, stuck_rank: int) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"seconds": seconds, "stuck_rank": stuck_rank},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="real-jobs-train-")),
    )
    ready()
    trainer.fit()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["gloo", "ps", "train", "verl"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=HANG_SECONDS)
    parser.add_argument("--stuck-rank", type=int, default=-1)
    parser.add_argument("--die-rank", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--swap-rank", type=int, default=-1)
    args = parser.parse_args(argv)
    ray.init(address=args.address, log_to_driver=False)
    if args.kind == "gloo":
        run_gloo(args.workers, args.seconds, args.stuck_rank, args.raise_rank, args.swap_rank)
    elif args.kind == "ps":
        run_ps(args.workers, args.seconds, args.die_rank)
    elif args.kind == "verl":
        run_verl(args.workers, args.seconds, args.stuck_rank)
    else:
        run_train(args.workers, args.seconds, args.stuck_rank)


if __name__ == "__main__":
    main(sys.argv[1:])
