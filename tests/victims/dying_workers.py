"""Victim: ranked workers that die in every way a real job loses a rank.

No raysleuth inside. Ranks come from where real jobs put them: the
``RANK``/``WORLD_SIZE`` of the actor's ``runtime_env`` (plain DDP-in-actors
jobs, torchrun style) or a verl-style actor name (``<prefix>WorkerDict_0:<rank>``).
Each death is a method of :class:`Worker`, the way it happens in training
code: a native call that segfaults inside a named function, a gloo-style
``abort()``, an early ``sys.exit(3)``, a ``SIGKILL`` from outside.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

import ray


def read_native_buffer(address: int) -> bytes:
    """A native read gone wrong: the Python function the segfault happens in."""
    return ctypes.string_at(address)


class Worker:
    """One training rank."""

    def __init__(self, fail_in_init: bool = False) -> None:
        self.rank = int(os.environ.get("RANK", "-1"))
        self.step_no = 0
        if fail_in_init:
            raise FileNotFoundError(f"checkpoint shard for rank {self.rank} not found")

    def pid(self) -> int:
        return os.getpid()

    def step(self) -> int:
        self.step_no += 1
        print(f"rank {self.rank} step {self.step_no} loss 0.{self.step_no}", flush=True)
        return self.step_no

    def segfault(self) -> None:
        print(f"rank {self.rank}: reading the native buffer", flush=True)
        read_native_buffer(0)

    def abort(self) -> None:
        print(f"rank {self.rank}: collective sequence mismatch, aborting", file=sys.stderr, flush=True)
        os.abort()

    def exit_early(self, code: int = 3) -> None:
        print(f"rank {self.rank}: bad config, exiting with {code}", flush=True)
        sys.exit(code)

    def sigkill(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def allocate(self, megabytes_per_step: int = 200, steps: int = 200, pause: float = 0.05) -> int:
        """Grow memory until something stops it (Ray's memory monitor in the test)."""
        hoard = []
        for _ in range(steps):
            hoard.append(bytearray(megabytes_per_step * 2**20))
            for page in range(0, len(hoard[-1]), 4096):
                hoard[-1][page] = 1
            time.sleep(pause)
        return len(hoard)


def start(rank: int, world_size: int, *, name: str | None = None, fail_in_init: bool = False,
          node_id: str | None = None, env: bool = True, **options):
    """Create rank ``rank``'s worker the way a DDP-in-actors job does (RANK in its runtime_env).

    ``env=False`` leaves RANK out: the rank is then only in the name (give one the way verl
    names its workers, ``<prefix>WorkerDict_0:<rank>``).
    """
    remote = ray.remote(num_cpus=0.01, max_restarts=0)(Worker)
    env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank)} if env else {}
    if node_id:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    if name:
        options["name"] = name
    return remote.options(runtime_env={"env_vars": env}, **options).remote(fail_in_init=fail_in_init)


def preprocess_shard(shard: int) -> int:
    """A plain Ray task body (no actor) whose native call segfaults."""
    print(f"preprocessing shard {shard}", flush=True)
    read_native_buffer(0)
    return shard
