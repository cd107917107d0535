"""Victim job with no raysleuth in it: a Ray Train ``TorchTrainer`` whose world rank ``--slow-rank`` reads slowly.

Three CPU workers train a small model under DDP (``prepare_model``); the
slow worker's data comes from a throttled disk, so each of its batch reads
takes 4x longer and every step of its peers waits for it in DDP's gradient
all_reduce.

Run: ``python -m victims.slow_train [--address A] [--workers N] [--steps N] [--slow-rank R]``.
Prints ``training JOB`` before it starts the trainer.
"""

from __future__ import annotations

import argparse
import time

import ray
import ray.train
import torch
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model

READ_SECONDS = 0.03


def load_batch(read_seconds: float) -> tuple[torch.Tensor, torch.Tensor]:
    time.sleep(read_seconds)  # waiting on the disk
    return torch.randn(16, 32), torch.randn(16, 4)


def train_loop_per_worker(config: dict) -> None:
    torch.set_num_threads(1)
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rank = ray.train.get_context().get_world_rank()
    read_seconds = READ_SECONDS * (4 if rank == config["slow_rank"] else 1)
    for _step in range(config["steps"]):
        inputs, targets = load_batch(read_seconds)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ray.train.report({"loss": loss.item()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default=None)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--slow-rank", type=int, default=1)
    args = parser.parse_args()
    ray.init(address=args.address, log_to_driver=False)
    print("training", ray.get_runtime_context().get_job_id(), flush=True)
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config={"steps": args.steps, "slow_rank": args.slow_rank},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False, resources_per_worker={"CPU": 0.5}),
    )
    print(f"finished: {trainer.fit().metrics}", flush=True)


if __name__ == "__main__":
    main()
