"""Ray task throughput with ``enable_detailed_tracing()`` on vs off, in the same run.

Starts its own local Ray (2 CPUs), submits batches of trivial tasks and
actor calls, alternating traced and untraced rounds so load drift hits both
alike. Target: traced under 5% slower. (The default records submissions;
``completion=True`` adds a Ray completion callback per call and is far costlier.)
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault("RAYSLEUTH_HOME", tempfile.mkdtemp(prefix="raysleuth-bench-"))

import ray  # noqa: E402

import raysleuth as rs  # noqa: E402

TASKS = int(os.environ.get("BENCH_TASKS", "400"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "4"))


@ray.remote(num_cpus=0)
def noop(x):
    return x


@ray.remote(num_cpus=0)
class Echo:
    def echo(self, x):
        return x


def round_trip(actor) -> float:
    start = time.perf_counter()
    refs = [noop.remote(i) for i in range(TASKS)] + [actor.echo.remote(i) for i in range(TASKS)]
    ray.get(refs)
    return 2 * TASKS / (time.perf_counter() - start)


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    actor = Echo.remote()
    round_trip(actor)  # warm up workers
    off, on = [], []
    for _ in range(ROUNDS):
        off.append(round_trip(actor))
        with rs.enable_detailed_tracing():
            on.append(round_trip(actor))
    from raysleuth.recorder import get_client

    get_client().flush(30)
    best_off, best_on = max(off), max(on)
    slower = (best_off - best_on) / best_off * 100
    print(f"untraced: {best_off:8.0f} calls/s (best of {ROUNDS})")
    print(f"traced:   {best_on:8.0f} calls/s (best of {ROUNDS})")
    print(f"traced is {slower:+.1f}% slower   ratio {best_on / best_off:.3f}   target < 5%: "
          f"{'OK' if slower < 5 else 'MISSED'}")
    ray.shutdown()


if __name__ == "__main__":
    main()
