"""Record the saved dumps that tests/test_collectives_matcher.py replays (run by hand, on CPU).

    PYTHONPATH=src:tests python -m victims.record_collective_dumps [FAULT ...]

Starts a local Ray, runs the gloo job of :mod:`victims.collective_faults`
once per fault with raysleuth given only as Ray's worker setup hook (full
mode: periodic dumps), asks for a dump as ``raysleuth collectives`` does, and
writes ``tests/data/collectives/<fault>.json``: the job's ``collectives``
records, the (node_ip, pid) pairs alive at that moment, and the driver's pids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FAULTS = ["healthy", "skip", "shape", "op", "stuck", "die"]


def job_environment(mode: str = "full") -> dict[str, str]:
    """The driver's environment: what ``ray job submit --runtime-env-json`` hands a job's driver."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])
    runtime_env = {"worker_process_setup_hook": "raysleuth.collectives.install",
                   "env_vars": {"RAYSLEUTH_MODE": mode, "PYTHONPATH": path,
                                "RAYSLEUTH_HOME": os.environ["RAYSLEUTH_HOME"]}}
    return dict(os.environ, PYTHONPATH=path, RAY_JOB_CONFIG_JSON_ENV_VAR=json.dumps({"runtime_env": runtime_env}))


def start_job(fault: str, address: str, *, mode: str = "full", pause: float = 0.3, linger: float = 120.0,
              world_size: int = 3, steps: int = 8, backend: str = "gloo") -> subprocess.Popen:
    """Start the victim job's driver (returns at once; :func:`job_started` reads its first line)."""
    log = tempfile.NamedTemporaryFile("w+", prefix=f"victim-{fault}-", suffix=".log", delete=False)
    driver = subprocess.Popen(
        [sys.executable, "-m", "victims.collective_faults", fault, "--address", address, "--pause", str(pause),
         "--linger", str(linger), "--world-size", str(world_size), "--steps", str(steps), "--backend", backend],
        env=job_environment(mode), stdout=subprocess.PIPE, stderr=log, text=True, cwd=str(ROOT))
    driver.log_path = log.name
    return driver


def job_started(driver: subprocess.Popen) -> tuple[str, list[int]]:
    """Wait for the driver's ``training JOB PIDS`` line: (job id, worker pids)."""
    for text in driver.stdout:  # Ray may print its own warnings first
        line = text.split()
        if len(line) >= 2 and line[0] == "training":
            return line[1], [int(p) for p in line[2:]]
    driver.kill()
    code = driver.wait()
    tail = Path(driver.log_path).read_text(errors="replace")[-1500:]
    raise RuntimeError(f"victim job ended before training (exit {code}): {tail}")


def main(faults: list[str]) -> None:
    os.environ.setdefault("RAYSLEUTH_HOME", tempfile.mkdtemp(prefix="rs-home-"))
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
    import ray

    context = ray.init(address="local", num_cpus=8, include_dashboard=True, log_to_driver=False)
    from raysleuth.collectives.report import _alive_processes, _read, request_dump
    from raysleuth.recorder import get_writer, open_store
    from raysleuth import cluster

    get_writer()
    for fault in faults:
        driver = start_job(fault, context.address_info["address"])
        _, pids = job_started(driver)
        time.sleep(12)
        request_dump()
        time.sleep(4)
        store = open_store(cluster.session_name())
        records = _read(store, None)
        store.close()
        alive = sorted([ip, pid] for ip, pid in (_alive_processes() or set()) if ip and pid in pids)
        out = {"fault": fault, "worker_pids": pids, "alive": alive, "time": time.time(), "records": records}
        (ROOT / "tests" / "data" / "collectives" / f"{fault}.json").write_text(json.dumps(out, indent=1))
        print(fault, len(records), "records;", len(alive), "alive of", len(pids), flush=True)
        driver.kill()
        driver.wait()
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:] or FAULTS)
