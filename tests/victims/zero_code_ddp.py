"""Victim job with no raysleuth in it: data-parallel training on Ray actors over gloo.

Each actor joins the process group in ``__init__`` with the rank the driver
gives it (ranks exist only in ``torch.distributed``: no RANK env, no names),
wraps a small model in DistributedDataParallel and trains. At step
``--fail-step`` rank ``--fail-rank`` raises in its update, with a token in
its locals, before its backward: its peers then wait in DDP's all_reduce.
The driver stops at the first error (``ray.wait``), so the job exits 1 with
the rank's traceback, as such jobs do.

With ``--kill-rank R`` rank R is SIGKILLed at ``--fail-step`` instead (what
the kernel OOM killer does: no output, no exit code); its peers then fail in
gloo ("Connection closed by peer") and the driver stops at the first error.

Run: ``python tests/victims/zero_code_ddp.py [--steps N] [--fail-step S] [--fail-rank R] [--kill-rank R]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time

import ray
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


@ray.remote(num_cpus=0.5)
class DataParallelWorker:
    def __init__(self, rank: int, world_size: int, port: int) -> None:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        torch.manual_seed(0)
        self.model = DistributedDataParallel(torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.generator = torch.Generator().manual_seed(rank)

    def update(self, step: int, fail_step: int, fail_rank: int, kill_rank: int = -1) -> float:
        if step == fail_step and dist.get_rank() == kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        inputs = torch.randn(32, 64, generator=self.generator)
        targets = torch.randn(32, 8, generator=self.generator)
        loss = torch.nn.functional.mse_loss(self.model(inputs), targets)
        if step == fail_step and dist.get_rank() == fail_rank:
            hub_token = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"  # noqa: F841 - in the locals of the crash
            raise FloatingPointError(f"loss became nan at step {step}")
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def train(self, steps: int) -> float:
        """A loop inside the actor (for the overhead benchmark): ``steps`` updates, no failure."""
        loss = 0.0
        for step in range(steps):
            loss = self.update(step, -1, -1)
        return loss


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fail-step", type=int, default=3)
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--kill-rank", type=int, default=-1, help="SIGKILL this rank at --fail-step instead")
    parser.add_argument("--loop-steps", type=int, default=0, help="train N steps per call, timed (benchmark)")
    args = parser.parse_args()
    ray.init()
    port = free_port()
    workers = [DataParallelWorker.remote(rank, args.world_size, port) for rank in range(args.world_size)]
    if args.loop_steps:
        ray.get([worker.train.remote(5) for worker in workers])  # warm up
        started = time.perf_counter()
        ray.get([worker.train.remote(args.loop_steps) for worker in workers])
        print(f"seconds per step: {(time.perf_counter() - started) / args.loop_steps:.6f}")
        return
    for step in range(args.steps):
        pending = [worker.update.remote(step, args.fail_step, args.fail_rank, args.kill_rank) for worker in workers]
        losses = []
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            losses.extend(ray.get(done))
        print(f"step {step}: mean loss {sum(losses) / len(losses):.4f}")


if __name__ == "__main__":
    main()
