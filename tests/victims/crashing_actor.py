"""Victim: actors and a task that crash, under @rs.capture_crashes in every order.

Each class raises from a method with a secret-named local (``api_token``)
and an ordinary one, so tests can check the capsule's rank, exception,
redacted locals and explained cause. The messages are real error texts
(PyTorch's CUDA OOM) so the capsule's cause comes from the knowledge base.
"""

from __future__ import annotations

import asyncio

import ray

import raysleuth as rs

CUDA_OOM = ("CUDA out of memory. Tried to allocate 1.69 GiB (GPU 0; 14.56 GiB total capacity; "
            "649.97 MiB already allocated; 1.31 GiB free; 1.01 GiB reserved in total by PyTorch)")


class Trainer:
    """A training worker whose step crashes on demand."""

    def __init__(self, rank: int, fail_in_init: bool = False) -> None:
        rs.set_rank(rank, 4)
        self.rank = rank
        if fail_in_init:
            secret_password = "hunter2-hunter2"  # noqa: F841 - a local the capsule must redact
            raise FileNotFoundError(f"checkpoint for rank {rank} not found on this node")

    def whoami(self) -> int:
        return self.rank

    def step(self, step: int, tag: str) -> float:
        api_token = "hf_" + "x" * 34  # noqa: F841 - a local the capsule must redact
        micro_batch = [step] * 4  # noqa: F841
        if step >= 0:
            raise RuntimeError(f"{CUDA_OOM} [{tag}]")
        return 0.0

    def bad_input(self, tag: str) -> None:
        learning_rate = 3e-4  # noqa: F841
        raise ValueError(f"learning rate schedule has no entry for this step [{tag}]")

    def handled(self, tag: str) -> str:
        try:
            self.bad_input(tag)
        except ValueError:
            return "recovered"
        return "no error"

    async def astep(self, tag: str) -> None:
        api_token = "sk-" + "a1b2c3d4" * 4  # noqa: F841
        await asyncio.sleep(0)
        raise KeyError(f"missing batch key [{tag}]")


@ray.remote(num_cpus=0.01)
@rs.capture_crashes
class RemoteOverCapture(Trainer):
    """``@ray.remote`` on top of ``@rs.capture_crashes``."""


@rs.capture_crashes
@ray.remote(num_cpus=0.01)
class CaptureOverRemote(Trainer):
    """``@rs.capture_crashes`` on top of ``@ray.remote``."""


@ray.remote(num_cpus=0.01)
class Uninstrumented(Trainer):
    """No decorator: instrumented later through ``__ray_call__``."""


@rs.capture_crashes
@ray.remote(num_cpus=0.01)
def crashing_task(tag: str) -> None:
    """A plain Ray task that crashes."""
    api_token = "ghp_" + "Z" * 36  # noqa: F841
    raise ZeroDivisionError(f"division by zero in reward [{tag}]")
