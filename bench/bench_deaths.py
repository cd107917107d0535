"""Benchmark: reading the evidence of 100 dead actors (`raysleuth tasks --dead`) in under 5 s.

Starts its own one-node Ray (``ray.cluster_utils.Cluster`` with a free
dashboard-agent port, so Ray's log API answers even beside other clusters),
creates 100 ranked actors (RANK in each runtime_env) in batches and kills
them in the ways real ranks die (SIGKILL, segfault, sys.exit), then times,
over the very same deaths:

- baseline: what a user does by hand — each dead actor's ``.err`` and
  ``.out`` through Ray's log API (``ray logs actor --id ... --err``), one
  after the other;
- raysleuth: ``find_deaths()`` end to end — State API listings, every log
  through the node agent (one call per node; Ray's log API in parallel as
  the fallback), the node's OOM evidence, the store, ranks and verdicts.

Prints wall times and the ratio (baseline / raysleuth; > 1 means faster).
Exits 1 when raysleuth takes 5 s or more, or misclassifies a death.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time

from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)

TARGET_S = 5.0
DEATHS = int(os.environ.get("RAYSLEUTH_BENCH_DEATHS", "100"))
REPEATS = 3
BATCH = 20


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def kill_all(dw, ray) -> dict[str, str]:
    """Create and kill DEATHS ranks; returns actor id -> the cause it must be classified as."""
    expected: dict[str, str] = {}
    for start in range(0, DEATHS, BATCH):
        handles = {rank: dw.start(rank, DEATHS) for rank in range(start, min(start + BATCH, DEATHS))}
        ray.get([handle.step.remote() for handle in handles.values()], timeout=600)
        calls = []
        for rank, handle in handles.items():
            how = ("sigkill", "segfault", "exit_early")[rank % 3]
            calls.append(getattr(handle, how).remote())
            expected[handle._actor_id.hex()] = {"sigkill": "sigkill", "segfault": "fatal_signal",
                                                "exit_early": "exit"}[how]
        for call in calls:
            try:
                ray.get(call, timeout=120)
            except Exception:
                pass
        print(f"  {len(expected)} ranks dead", flush=True)
    return expected


def baseline(actor_ids: list[str]) -> tuple[float, int]:
    """Each dead actor's err and out logs through Ray's log API, one after the other; (seconds, failures)."""
    from raysleuth import cluster

    started = time.perf_counter()
    failed = 0
    for actor_id in actor_ids:
        for suffix in ("err", "out"):
            try:
                cluster.worker_log(actor_id=actor_id, suffix=suffix, tail=200, timeout=30)
            except Exception as error:
                if not failed:
                    print(f"  baseline read failed: {str(error)[:300]}")
                failed += 1
    return time.perf_counter() - started, failed


def main() -> int:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    os.environ.setdefault("RAYSLEUTH_HOME", os.path.join("/tmp", f"raysleuth-bench-deaths-{os.getpid()}"))
    import ray
    from ray.cluster_utils import Cluster

    from raysleuth.deaths import find_deaths
    from victims import dying_workers as dw

    node = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "include_dashboard": True, "dashboard_port": free_port(),
        "dashboard_agent_listen_port": free_port()})
    ray.init(address=node.address, log_to_driver=False)
    try:
        expected = kill_all(dw, ray)
        time.sleep(2)
        find_deaths()  # warm: node agent created, State API connections open
        ours, wrong, log_seconds = [], 0, []
        for _ in range(REPEATS):
            started = time.perf_counter()
            report = find_deaths()
            ours.append(time.perf_counter() - started)
            log_seconds.append(report.log_seconds)
            found = {death.actor_id: death for death in report.deaths if death.actor_id in expected}
            wrong = sum(1 for actor_id, cause in expected.items()
                        if actor_id not in found or found[actor_id].cause != cause or found[actor_id].rank is None)
        shown = 0
        for actor_id, cause in list(expected.items()):
            death = found.get(actor_id)
            if (death is None or death.cause != cause or death.rank is None) and shown < 3:
                shown += 1
                print(f"  wrong: expected {cause}, got {death and (death.cause, death.rank, death.evidence[:4])}")
        base, failed = baseline(list(expected))
        median = statistics.median(ours)
        print(f"deaths read: {len(expected)}  misclassified or rankless: {wrong}")
        print(f"baseline (Ray log API, one log after another): {base:.2f}s ({failed} log reads failed)")
        print(f"raysleuth find_deaths (median of {REPEATS}): {median:.2f}s "
              f"(logs + OOM + store {statistics.median(log_seconds):.2f}s)  target < {TARGET_S:g}s")
        print(f"ratio baseline/raysleuth: {base / median:.1f}x")
        target("reading the deaths of 100 dead actors", median < TARGET_S, f"{median:.2f}s (< {TARGET_S:g}s)")
        target("every death classified with its rank", wrong == 0, f"{wrong} wrong or rankless")
        return exit_code()
    finally:
        ray.shutdown()
        node.shutdown()


if __name__ == "__main__":
    sys.exit(main())
