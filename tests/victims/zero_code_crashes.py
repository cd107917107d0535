"""Victim job with no raysleuth in it: every way a Ray worker's code can fail.

A task raises, an actor's ``__init__`` raises, an async actor method raises,
a thread started by an actor dies of an uncaught exception (and the actor
logs a warning about it), and a rollout
worker (given its rank the way verl does, through ``runtime_env`` env vars)
segfaults. The driver checks that each error reaches it as the job wrote it
and prints one line per check, so runs with and without instrumentation
can be compared line for line.

Run: ``python tests/victims/zero_code_crashes.py`` (starts its own Ray).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import sys
import threading

import ray


@ray.remote(num_cpus=0)
def load_shard(path: str) -> bytes:
    api_key = "sk-live-0123456789abcdef0123"  # noqa: F841 - a secret the capsule must not keep
    raise FileNotFoundError(f"shard missing: {path}")


@ray.remote(num_cpus=0)
class Tokenizer:
    def __init__(self, vocab_size: int) -> None:
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        self.vocab_size = vocab_size


@ray.remote(num_cpus=0)
class RewardModel:
    async def score(self, text: str) -> float:
        await asyncio.sleep(0)
        raise RuntimeError(f"cannot score {text!r}")

    def start_prefetch(self) -> str:
        def prefetch() -> None:
            raise ConnectionError("prefetch server gone")

        thread = threading.Thread(target=prefetch, name="prefetcher")
        thread.start()
        thread.join()
        logging.getLogger("reward.cache").warning("prefetch failed; scoring without the cache")
        return "prefetch finished"


@ray.remote(num_cpus=0)
class Rollout:
    def generate(self, prompt: str) -> str:
        return ctypes.string_at(0).decode()  # reads address 0: SIGSEGV


def main() -> int:
    ray.init()
    try:
        ray.get(load_shard.remote("/data/shard-7.parquet"))
    except ray.exceptions.RayTaskError as error:
        print(f"load_shard: {type(error.cause).__name__}: {error.cause}")
    tokenizer = Tokenizer.remote(0)
    try:
        ray.get(tokenizer.__ray_ready__.remote())
    except ray.exceptions.RayActorError as error:
        print(f"tokenizer: died in __init__: {'vocab_size must be positive, got 0' in str(error)}")
    reward = RewardModel.remote()
    try:
        ray.get(reward.score.remote("hello"))
    except ray.exceptions.RayTaskError as error:
        print(f"reward.score: {type(error.cause).__name__}: {error.cause}")
    print(f"reward.start_prefetch: {ray.get(reward.start_prefetch.remote())}")
    rollout = Rollout.options(runtime_env={"env_vars": {"RANK": "1", "WORLD_SIZE": "2"}}).remote()
    try:
        ray.get(rollout.generate.remote("hi"))
    except ray.exceptions.RayActorError:
        print("rollout: worker died")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
