"""Benchmark: `raysleuth tasks` (find_tasks, defaults) on a long-lived cluster with thousands of finished tasks.

Starts its own one-node Ray, runs ``FINISHED`` short tasks (default 6000, as
a cluster accumulates them over a day of training), then leaves one actor
call running far beyond its peers (stuck), one task failed and one pending
on a missing GPU. Times, over the same cluster:

- baseline: one unfiltered task listing (``cluster.tasks()``), which is what
  find_tasks read before it let the State API filter (every finished task,
  each with its events);
- raysleuth: ``find_tasks()`` end to end with its defaults (pending, stuck,
  failed, dead), listing unfinished and failed tasks and the running calls'
  finished peers only.

Prints wall times and the ratio (baseline / raysleuth; > 1 means faster).
Exits 1 when find_tasks is not at least 2x faster than the listing alone, or
when it misses the stuck, failed or pending task.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)

FINISHED = int(os.environ.get("RAYSLEUTH_BENCH_FINISHED_TASKS", "6000"))
REPEATS = 3
TARGET_RATIO = 2.0


def main() -> int:
    import ray

    from raysleuth import cluster
    from raysleuth.tasks import find_tasks

    context = ray.init(address="local", num_cpus=2, include_dashboard=True, log_to_driver=False)
    address = context.address_info["gcs_address"]

    @ray.remote
    def short(i: int) -> int:
        return i

    @ray.remote
    def broken() -> None:
        raise ValueError("bench: failed on purpose")

    @ray.remote(num_gpus=1)
    def needs_gpu() -> None:
        return None

    @ray.remote
    class Worker:
        def work(self, seconds: float) -> float:
            time.sleep(seconds)
            return seconds

    try:
        started = time.monotonic()
        for first in range(0, FINISHED, 1000):
            ray.get([short.remote(i) for i in range(first, min(first + 1000, FINISHED))], timeout=600)
        worker = Worker.remote()
        ray.get([worker.work.remote(0.05) for _ in range(6)], timeout=120)
        stuck = worker.work.remote(600)
        failed = broken.remote()
        try:
            ray.get(failed, timeout=120)
        except Exception:
            pass
        pending = needs_gpu.remote()
        time.sleep(12)  # past find_tasks' stuck floor (10 s), and the task events reach the GCS
        print(f"cluster: {FINISHED} finished tasks in {time.monotonic() - started:.1f}s", flush=True)
        cluster.connect(address)

        baseline, ours, report = [], [], None
        for _ in range(REPEATS):
            began = time.monotonic()
            listed = cluster.tasks()
            baseline.append(time.monotonic() - began)
            began = time.monotonic()
            report = find_tasks(address)
            ours.append(time.monotonic() - began)
        base, mine = statistics.median(baseline), statistics.median(ours)
        print(f"baseline: one unfiltered listing of {len(listed)} tasks: median {base:.2f}s "
              f"(runs {', '.join(f'{t:.2f}' for t in baseline)})")
        print(f"raysleuth: find_tasks() with its defaults: median {mine:.2f}s "
              f"(runs {', '.join(f'{t:.2f}' for t in ours)})")
        ratio = base / mine if mine > 0 else float("inf")
        target("find_tasks vs one unfiltered listing", ratio >= TARGET_RATIO,
               f"{ratio:.1f}x faster (need >= {TARGET_RATIO:.0f}x)")
        found = (any(item.task_id == stuck.task_id().hex() for item in report.stuck),
                 any(item.task_id == failed.task_id().hex() for item in report.failed),
                 any(item.task_id == pending.task_id().hex() for item in report.pending))
        target("stuck, failed and pending tasks found", all(found), f"stuck/failed/pending found: {found}")
        target("no listing cut at the State API's limit", not report.truncated, f"truncated: {report.truncated}")
    finally:
        ray.shutdown()
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
