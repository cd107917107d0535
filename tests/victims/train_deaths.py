"""Victim: a Ray Train job (TorchTrainer, gloo on CPU) whose rank 1 is SIGKILLed mid-training.

No raysleuth inside. Ray Train sets RANK with ``os.environ`` inside the
worker, so the rank of the dead worker is only in Ray Train's own logs.
"""

from __future__ import annotations

import os
import signal
import time


def train_loop(config: dict) -> None:
    import torch
    import torch.distributed as dist

    import ray.train

    rank = ray.train.get_context().get_world_rank()
    for step in range(1000):
        tensor = torch.ones(4) * step
        dist.all_reduce(tensor)
        print(f"{config['tag']} rank {rank} step {step}", flush=True)
        if rank == config["victim"] and step == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.2)


def run(victim: int = 1, workers: int = 2, *, tag: str = "train", storage: str = "/tmp/raysleuth-train-deaths",
        ) -> Exception | None:
    """Train until the victim rank dies; returns the error fit() raised."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        train_loop, train_loop_config={"victim": victim, "tag": tag},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(failure_config=FailureConfig(max_failures=0), storage_path=storage),
    )
    try:
        trainer.fit()
    except Exception as error:
        return error
    return None
