"""Victim: a rank that Ray's memory monitor kills, on its own small cluster.

``python -m victims.memory_monitor_death`` sets ``RAY_memory_usage_threshold``
just above this machine's current memory use, starts a one-node local Ray,
lets rank 0 (RANK in its runtime_env) allocate until the monitor kills it,
then prints ``raysleuth.deaths.find_deaths()`` for that actor as JSON on the
last line. Run it with its own RAYSLEUTH_HOME: it is another Ray session.
"""

from __future__ import annotations

import json
import os
import time


def main() -> None:
    import psutil

    memory = psutil.virtual_memory()
    threshold = min(0.95, (memory.total - memory.available + 1.5 * 2**30) / memory.total)
    os.environ["RAY_memory_usage_threshold"] = f"{threshold:.3f}"
    os.environ["RAY_memory_monitor_refresh_ms"] = "100"
    import ray

    from victims import dying_workers

    ray.init(address="local", num_cpus=2, include_dashboard=True, log_to_driver=False)
    try:
        worker = dying_workers.start(0, 2)
        ray.get(worker.step.remote(), timeout=120)
        try:
            ray.get(worker.allocate.remote(100, 100, 0.05), timeout=180)
            outcome = "survived"
        except Exception as error:
            outcome = type(error).__name__
        time.sleep(1)
        from raysleuth.deaths import find_deaths

        report = find_deaths()
        mine = [death.to_dict() for death in report.deaths if death.actor_id == worker._actor_id.hex()]
        print(json.dumps({"threshold": threshold, "outcome": outcome, "deaths": mine, "warnings": report.warnings}))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
