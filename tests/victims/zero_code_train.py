"""Victim job with no raysleuth in it: a Ray Train ``TorchTrainer`` as its docs write one.

Two CPU workers train a small model under DDP (``prepare_model``); at step
``--fail-step`` world rank ``--fail-rank`` hits a bad batch and raises. Ray
Train reports the failure to the driver (``TrainingFailedError``), and the
job exits 1.

Run: ``python tests/victims/zero_code_train.py [--workers N] [--fail-step S] [--fail-rank R]``.
"""

from __future__ import annotations

import argparse

import ray
import ray.train
import torch
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model


def train_loop_per_worker(config: dict) -> None:
    torch.set_num_threads(1)
    model = prepare_model(torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rank = ray.train.get_context().get_world_rank()
    for step in range(config["steps"]):
        batch = torch.randn(8, 16)
        if step == config["fail_step"] and rank == config["fail_rank"]:
            wandb_api_key = "wandb-0123456789abcdef0123456789abcdef"  # noqa: F841 - a secret in the locals
            raise ValueError(f"corrupt batch at step {step}: labels out of range")
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ray.train.report({"step": step, "loss": loss.item()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fail-step", type=int, default=2)
    parser.add_argument("--fail-rank", type=int, default=1)
    args = parser.parse_args()
    ray.init()
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"steps": args.steps, "fail_step": args.fail_step, "fail_rank": args.fail_rank},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False, resources_per_worker={"CPU": 0.5}),
    )
    result = trainer.fit()
    print(f"finished: {result.metrics}")


if __name__ == "__main__":
    main()
