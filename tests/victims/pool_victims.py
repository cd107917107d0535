"""Victims for the pool tests: functions run in pool workers, and a plain actor."""

import logging
import os

import ray


def whoami_rank():
    return int(os.environ["RANK"])


def log_line(text):
    logging.getLogger("victim.pool").warning("%s from rank %s", text, os.environ.get("RANK"))
    return True


def explode_on_rank_two(value):
    api_token = "hf_abcdefghijklmnopqrstuvwxyz012345"  # must be redacted in the capsule
    if int(os.environ["RANK"]) == 2:
        raise ValueError(f"bad batch {value}")
    return len(api_token)


@ray.remote(num_cpus=0)
class PlainTrainer:
    """Knows nothing of raysleuth."""

    def __init__(self, bias):
        self.bias = bias

    def weights(self):
        return [1.0, 2.0, 3.0 + self.bias]

    def update(self, batch):
        secret_key = "sk-live-0123456789abcdef0123456789"
        if batch < 0:
            raise RuntimeError(f"negative batch {batch}")
        return batch + len(secret_key)

    def pid(self):
        return os.getpid()


def weights_or_fail(worker):
    """A compare() function that raises on rank 1, as a user's buggy check would."""
    if worker.rank == 1:
        raise KeyError("layer.3.weight")
    return [1.0, 2.0, 3.0]
