"""Record the evidence real deaths leave, for the classifier's unit tests (tests/data/deaths/).

Run by hand (``python -m victims.save_death_evidence OUT_DIR``): starts its
own local Ray, kills ranks of :mod:`victims.dying_workers` in every way,
and saves what :func:`raysleuth.deaths.collect.gather` read for each one
(State API rows, worker log tails, the node's OOM reading) as JSON. With
``--memory-monitor`` it starts a cluster whose memory-usage threshold sits
just above the machine's current use, and saves Ray's memory-monitor kill.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path


def _save(out: Path, name: str, evidence) -> None:
    data = dataclasses.asdict(evidence)
    data["err_lines"] = data["err_lines"][-80:]
    data["out_lines"] = data["out_lines"][-20:]
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def deaths(out: Path) -> None:
    import ray

    from victims import dying_workers as dw

    ray.init(address="local", num_cpus=4, include_dashboard=True, log_to_driver=False)
    from raysleuth.deaths.collect import gather

    workers = {rank: dw.start(rank, 7) for rank in range(6)}
    init_failure = dw.start(6, 7, fail_in_init=True)  # noqa: F841 - kept: a dropped handle is REF_DELETED
    ray.get([worker.step.remote() for worker in workers.values()])
    calls = [workers[0].sigkill.remote(), workers[1].segfault.remote(), workers[2].abort.remote(),
             workers[3].exit_early.remote(3)]
    ray.kill(workers[4])
    for call in calls:
        try:
            ray.get(call, timeout=60)
        except Exception:
            pass
    time.sleep(2)
    names = {"0": "sigkill", "1": "segfault", "2": "abort", "3": "sys_exit_3", "4": "ray_kill", "6": "init_failed"}
    subjects, evidence, _store, _warnings = gather()
    for subject, found in zip(subjects, evidence):
        env = json.loads((subject["actor"] or {}).get("serialized_runtime_env") or "{}").get("env_vars", {})
        if env.get("RANK") in names:
            _save(out, names[env["RANK"]], found)
    ray.shutdown()


def memory_monitor(out: Path) -> None:
    import psutil

    memory = psutil.virtual_memory()
    threshold = min(0.95, (memory.total - memory.available + 1.5 * 2**30) / memory.total)
    os.environ["RAY_memory_usage_threshold"] = f"{threshold:.3f}"
    os.environ["RAY_memory_monitor_refresh_ms"] = "100"
    import ray

    from victims import dying_workers as dw

    ray.init(address="local", num_cpus=2, include_dashboard=True, log_to_driver=False)
    from raysleuth.deaths.collect import gather

    worker = dw.start(0, 1, name="memhog_rank0")
    ray.get(worker.step.remote())
    try:
        ray.get(worker.allocate.remote(100, 80, 0.05), timeout=120)
    except Exception:
        pass
    time.sleep(2)
    subjects, evidence, _store, _warnings = gather()
    for subject, found in zip(subjects, evidence):
        if (subject["actor"] or {}).get("name") == "memhog_rank0":
            _save(out, "memory_monitor", found)
    ray.shutdown()


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    memory_monitor(target) if "--memory-monitor" in sys.argv else deaths(target)
