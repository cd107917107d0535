"""Benchmark: one poll of the writer's death watch costs a small part of classifying the deaths it guards.

The watch (``raysleuth.deaths.watch``) polls Ray's dead actors every second
while the cluster lives; it only classifies (logs, OOM readings) when an
actor it has not recorded died. Starts its own one-node Ray, kills
``RAYSLEUTH_BENCH_DEATHS`` (default 30) ranked actors by SIGKILL, records
their deaths once, then times, over the very same cluster:

- baseline: ``find_deaths()``, what each poll would cost if it classified
  every time (and what ``raysleuth tasks --dead`` does);
- the watch's poll with nothing new: ``record_new_deaths()``.

Prints both and the ratio (baseline / poll; > 1 means the poll is cheaper).
Exits 1 when a poll takes 0.5 s or more, or more than a quarter of the
baseline, or a death was not recorded.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time

from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)

DEATHS = int(os.environ.get("RAYSLEUTH_BENCH_DEATHS", "30"))
POLLS = 10
TARGET_S = 0.5
TARGET_RATIO = 4.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> int:
    tests = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "tests"))
    sys.path.insert(0, tests)
    os.environ["PYTHONPATH"] = os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])  # workers import victims
    os.environ.setdefault("RAYSLEUTH_HOME", os.path.join("/tmp", f"raysleuth-bench-watch-{os.getpid()}"))
    import ray
    from ray.cluster_utils import Cluster

    from raysleuth.deaths import find_deaths, stored_deaths
    from raysleuth.deaths.watch import record_new_deaths
    from victims import dying_workers as dw

    node = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "include_dashboard": True, "dashboard_port": free_port(),
        "dashboard_agent_listen_port": free_port()})
    ray.init(address=node.address, log_to_driver=False)
    try:
        handles = [dw.start(rank, DEATHS) for rank in range(DEATHS)]
        ray.get([handle.step.remote() for handle in handles], timeout=600)
        ids = {handle._actor_id.hex() for handle in handles}
        for handle in handles:
            handle.sigkill.remote()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and record_new_deaths() == 0:
            time.sleep(1)
        while time.monotonic() < deadline and record_new_deaths() > 0:  # the rest of them, as they die
            time.sleep(1)
        recorded = {death.actor_id for death in stored_deaths()} & ids
        classify = []
        for _ in range(3):
            started = time.perf_counter()
            find_deaths()
            classify.append(time.perf_counter() - started)
        polls = []
        for _ in range(POLLS):
            started = time.perf_counter()
            record_new_deaths()
            polls.append(time.perf_counter() - started)
        base, poll = statistics.median(classify), statistics.median(polls)
        print(f"deaths recorded by the watch: {len(recorded)} of {len(ids)}")
        print(f"baseline find_deaths (median of 3): {base:.3f}s")
        print(f"watch poll with nothing new (median of {POLLS}): {poll:.3f}s  target < {TARGET_S:g}s")
        print(f"ratio baseline/poll: {base / poll:.1f}x")
        target("one watch poll", poll < TARGET_S, f"{poll:.3f}s (< {TARGET_S:g}s)")
        target("poll vs classifying", base / poll >= TARGET_RATIO, f"{base / poll:.1f}x (>= {TARGET_RATIO:g}x)")
        target("every death recorded", recorded == ids, f"{len(recorded)} of {len(ids)}")
        return exit_code()
    finally:
        ray.shutdown()
        node.shutdown()


if __name__ == "__main__":
    sys.exit(main())
