"""A data-parallel job on torch.distributed gloo, written as users write it (no raysleuth inside).

Each ``DDPWorker`` actor joins a gloo process group in ``__init__`` and
trains: per step, an all_reduce of the gradient (float32[64,64]) and an
all_reduce of the loss (float32[1]). At step ``FAULT_STEP`` one rank breaks
the sequence, depending on ``fault``:

- ``skip``: the faulty rank skips the loss all_reduce;
- ``shape``: it all-reduces a loss of shape [2];
- ``op``: it broadcasts the loss instead of all-reducing it;
- ``stuck``: it blocks in its data loader before the loss all_reduce;
- ``die``: its process is killed (SIGKILL, as the OOM killer does) before it;
- ``healthy``: nothing happens.

Tests give raysleuth to the workers through Ray's
``worker_process_setup_hook`` only.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import ray
import torch
import torch.distributed as dist

FAULT_STEP = 4
STEPS = 8


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def load_batch(step: int, stuck: bool, device: torch.device) -> torch.Tensor:
    if stuck:
        time.sleep(3600)  # a data loader that never returns
    return torch.full((64, 64), float(step), device=device)


@ray.remote(num_cpus=0)
class DDPWorker:
    def __init__(self, rank: int, world_size: int, port: int, backend: str = "gloo") -> None:
        self.device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")  # Ray sets the GPU
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                device_id=self.device if backend == "nccl" else None)
        self.rank = rank
        self.weights = torch.zeros(64, 64, device=self.device)

    def pid(self) -> int:
        return os.getpid()

    def train(self, fault: str = "healthy", fault_rank: int = 1, steps: int = STEPS, pause: float = 0.0) -> int:
        for step in range(steps):
            faulty = self.rank == fault_rank and step == FAULT_STEP
            batch = load_batch(step, faulty and fault == "stuck", self.device)
            grad = batch * 0.01
            dist.all_reduce(grad)
            self.weights -= grad
            loss = grad.mean().reshape(1)
            if faulty and fault == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            if faulty and fault == "skip":
                pass  # forgot to average the loss on this rank
            elif faulty and fault == "shape":
                dist.all_reduce(torch.cat([loss, loss]))
            elif faulty and fault == "op":
                dist.broadcast(loss, src=0)
            else:
                dist.all_reduce(loss)
            time.sleep(pause)
        return step


def start(fault: str, world_size: int = 3, fault_rank: int = 1, runtime_env: dict | None = None,
          steps: int = STEPS, pause: float = 0.0, backend: str = "gloo"):
    """Start the workers and their training calls; returns (workers, pids, train refs)."""
    port = free_port()
    options = {"runtime_env": runtime_env} if runtime_env else {}
    if backend == "nccl":
        options["num_gpus"] = 1
    workers = [DDPWorker.options(**options).remote(rank, world_size, port, backend) for rank in range(world_size)]
    pids = ray.get([worker.pid.remote() for worker in workers], timeout=600)
    refs = [worker.train.remote(fault, fault_rank, steps, pause) for worker in workers]
    return workers, pids, refs


def main(argv: list[str] | None = None) -> int:
    """``python -m victims.collective_faults FAULT --address A``: the job's driver, as a user runs it."""
    import argparse
    import sys

    parser = argparse.ArgumentParser()
    parser.add_argument("fault", choices=["healthy", "skip", "shape", "op", "stuck", "die"])
    parser.add_argument("--address", default=None)
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--linger", type=float, default=0.0, help="seconds to stay up after training")
    args = parser.parse_args(argv)
    ray.init(address=args.address, log_to_driver=False)
    workers, pids, refs = start(args.fault, args.world_size, args.fault_rank, steps=args.steps, pause=args.pause,
                                backend=args.backend)
    print("training", ray.get_runtime_context().get_job_id(), " ".join(map(str, pids)), flush=True)
    code = 0
    try:
        print("finished", ray.get(refs), flush=True)
    except Exception as error:  # a rank failed: the job fails, as real jobs do
        print("failed", type(error).__name__, flush=True)
        code = 1
    time.sleep(args.linger)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
