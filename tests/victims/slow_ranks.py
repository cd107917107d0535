"""Victim job with no raysleuth in it: gloo DDP on Ray actors where one rank is slow (or none is).

``--slow`` picks what happens to rank ``--slow-rank``:

- ``data``: its shard sits on a throttled disk: every batch read takes 4x longer;
- ``backward``: its backward pass runs slower (a hot device: its gradient kernels take longer);
- ``pause``: it stops once, for a few seconds, to save a checkpoint;
- ``none``: every rank even.

``--slow-after S``: the rank turns slow only S seconds into training (the
disk throttles, the device heats up), for the time-to-verdict benchmark.

Run: ``python -m victims.slow_ranks --slow data --slow-rank 2 [--address A] [--steps N]``.
Prints ``training JOB PIDS`` once the ranks train, ``finished`` at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import ray
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

READ_SECONDS = 0.03
"""One batch read from a healthy disk."""


class ShardReader:
    """Reads this rank's batches from its shard (the disk's speed is the read time)."""

    def __init__(self, rank: int, read_seconds: float) -> None:
        self.read_seconds = read_seconds
        self.generator = torch.Generator().manual_seed(rank)

    def read(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.read_seconds)  # waiting on the disk
        return torch.randn(16, 32, generator=self.generator), torch.randn(16, 4, generator=self.generator)


class DeviceLatency(torch.autograd.Function):
    """Identity forward; its backward takes as long as this device's gradient kernels do."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return inputs.view_as(inputs)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.seconds:
            time.sleep(ctx.seconds)  # the slower kernels
        return grad, None


class Net(torch.nn.Module):
    def __init__(self, backward_seconds: float) -> None:
        super().__init__()
        self.hidden, self.out = torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)
        self.backward_seconds = backward_seconds

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = DeviceLatency.apply(torch.relu(self.hidden(inputs)), self.backward_seconds)
        return self.out(hidden)


def save_checkpoint(model: torch.nn.Module, seconds: float) -> None:
    state = {name: value.clone() for name, value in model.state_dict().items()}
    time.sleep(seconds)  # writing it out
    del state


@ray.remote(num_cpus=0)
class Trainer:
    def __init__(self, rank: int, world_size: int, slow: str, slow_rank: int, slow_after: float = 0.0) -> None:
        self.rank, self.world_size = rank, world_size
        self.slow, self.slow_rank, self.slow_after = slow, slow_rank, slow_after

    def free_port(self) -> int:
        """A port free on this (rank 0's) node now: picked here, it is listened on a moment later, not seconds."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    def join(self, port: int) -> int:
        rank, world_size, slow, slow_rank, slow_after = (self.rank, self.world_size, self.slow, self.slow_rank,
                                                         self.slow_after)
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        torch.manual_seed(0)
        mine = rank == slow_rank
        self.slow_read = READ_SECONDS * (4 if mine and slow == "data" else 1)
        self.reader = ShardReader(rank, self.slow_read if not slow_after else READ_SECONDS)
        self.net = Net(0.0)
        self.slow_backward = 0.09 if mine and slow == "backward" else 0.0
        self.net.backward_seconds = self.slow_backward if not slow_after else 0.0
        self.model = DistributedDataParallel(self.net)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.pause_at = 40 if mine and slow == "pause" else None
        return os.getpid()

    def pid(self) -> int:
        return os.getpid()

    def train(self, steps: int) -> int:
        started = time.monotonic()
        for step in range(steps):
            if self.slow_after and time.monotonic() - started >= self.slow_after:
                self.reader.read_seconds, self.net.backward_seconds = self.slow_read, self.slow_backward
            inputs, targets = self.reader.read(step)
            loss = torch.nn.functional.mse_loss(self.model(inputs), targets)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            if step == self.pause_at:
                save_checkpoint(self.model, 3.0)
        return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow", choices=["none", "data", "backward", "pause"], default="none")
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--slow-after", type=float, default=0.0, help="turn slow this many seconds into training")
    parser.add_argument("--linger", type=float, default=0.0, help="seconds to stay up after training")
    parser.add_argument("--address", default=None)
    args = parser.parse_args(argv)
    ray.init(address=args.address, log_to_driver=False)
    workers = [Trainer.remote(rank, args.world_size, args.slow, args.slow_rank, args.slow_after)
               for rank in range(args.world_size)]
    ray.get([worker.pid.remote() for worker in workers], timeout=600)  # every worker is up
    port = ray.get(workers[0].free_port.remote())
    pids = ray.get([worker.join.remote(port) for worker in workers], timeout=600)
    refs = [worker.train.remote(args.steps) for worker in workers]
    print("training", ray.get_runtime_context().get_job_id(), " ".join(map(str, pids)), flush=True)
    ray.get(refs)
    print("finished", flush=True)
    time.sleep(args.linger)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
