"""Victim: a short job that ends promptly.

Four ranks (``RANK``/``WORLD_SIZE`` given through ``runtime_env``, the way
verl and torchrun jobs carry them) each log three warnings and one error
through raysleuth's public logger, then the driver calls ``ray.shutdown()``
at once. The driver imports no raysleuth: whatever the workers logged must
reach the run without it.

Run as a driver: ``python -m victims.prompt_exit ADDRESS [--repeats N]
[--quiet]``; each repeat is a new job (``ray.init`` ... ``ray.shutdown()``)
on the same cluster and prints ``JOB <job id> EXIT_SECONDS <s>`` (the time
spent in ``ray.shutdown()``). ``--quiet`` logs nothing (the baseline);
``--driver-logs``: the driver logs too.
"""

from __future__ import annotations

import os
import sys
import time

import ray


@ray.remote(num_cpus=0)
class Rank:
    """One rank: logs, then returns."""

    def work(self, quiet: bool = False) -> int:
        rank = int(os.environ["RANK"])
        if not quiet:
            import raysleuth as rs

            log = rs.get_logger("victims.prompt_exit")
            for index in range(3):
                log.warning("rank %d warning %d", rank, index)
            log.error("rank %d error", rank)
        return rank


def one_job(address: str, world_size: int = 4, quiet: bool = False, driver_logs: bool = False) -> tuple[str, float]:
    """Run the job once; returns its job id and how long ``ray.shutdown()`` took.

    ``driver_logs``: the driver logs 3 warnings and 1 error too (through raysleuth), just before shutting down.
    """
    ray.init(address=address, log_to_driver=False)
    job_id = ray.get_runtime_context().get_job_id()
    ranks = [
        Rank.options(runtime_env={"env_vars": {"RANK": str(r), "WORLD_SIZE": str(world_size)}}).remote()
        for r in range(world_size)
    ]
    assert sorted(ray.get([rank.work.remote(quiet) for rank in ranks])) == list(range(world_size))
    if driver_logs:
        import raysleuth as rs

        log = rs.get_logger("victims.prompt_exit.driver", console=False)
        for index in range(3):
            log.warning("driver warning %d", index)
        log.error("driver error")
    start = time.perf_counter()
    ray.shutdown()
    return job_id, time.perf_counter() - start


def main(argv: list[str]) -> None:
    address = argv[0]
    repeats = int(argv[argv.index("--repeats") + 1]) if "--repeats" in argv else 1
    for _ in range(repeats):
        job_id, seconds = one_job(address, quiet="--quiet" in argv, driver_logs="--driver-logs" in argv)
        print("JOB", job_id, "EXIT_SECONDS", round(seconds, 4), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
