"""Shutdown drain: what delivering evidence adds to a job's exit, and that nothing is lost.

The job (tests/victims/prompt_exit.py): 4 ranks each log 3 warnings and 1
error through raysleuth's logger, the driver logs 3 warnings and 1 error
too, then calls ``ray.shutdown()`` at once. Each repeat is a new Ray job on
one local cluster. Measured: the time ``ray.shutdown()`` takes in the
driver (raysleuth hands over the driver's evidence inside it).

- baseline: the same job with no records (``--quiet``), same cluster, same run;
- healthy: the writer answers — target: adds < 1 s (median), 20/20 records per job;
- gone: the writer process is stopped (SIGSTOP: alive to Ray, answering
  nothing) — target: adds < 5 s (max), and once it is resumed every record
  of every job is in the run (spooled, then ingested).

Exits non-zero on a miss. Usage: python bench/bench_exit.py [--repeats 20] [--gone-repeats 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
PER_JOB = 16 + 4  # 4 ranks x 4 records, plus the driver's 4


def run_jobs(address: str, home: str, repeats: int, *flags: str) -> list[tuple[str, float]]:
    env = dict(os.environ, RAYSLEUTH_HOME=home,
               PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "victims.prompt_exit", address, "--repeats", str(repeats), *flags],
                          cwd=TESTS, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"victim failed: {done.stderr[-3000:]}")
    return [(line.split()[1], float(line.split()[3])) for line in done.stdout.splitlines() if line.startswith("JOB ")]


def count_per_job(home: str, jobs: list[str], wait_s: float = 60.0) -> dict[str, int]:
    from raysleuth.recorder import open_store

    deadline = time.monotonic() + wait_s
    while True:
        store = open_store(home=home)  # connected: this cluster's run (spool ingested first)
        counts = {job: len(store.query("log", job=job)) for job in jobs}
        store.close()
        if all(value == PER_JOB for value in counts.values()) or time.monotonic() > deadline:
            return counts
        time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--gone-repeats", type=int, default=3)
    parser.add_argument("--baseline-repeats", type=int, default=3)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="raysleuth-bench-exit-")
    os.environ["RAYSLEUTH_HOME"] = home
    # workers (and the writer) must import this checkout's raysleuth, whatever is installed
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, str(ROOT / "src"))
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"RAYSLEUTH_HOME": home}})
    address = ray.get_runtime_context().gcs_address
    try:
        baseline = [s for _, s in run_jobs(address, home, args.baseline_repeats, "--quiet")]
        healthy = run_jobs(address, home, args.repeats, "--driver-logs")
        counts = count_per_job(home, [job for job, _ in healthy])
        kept = sum(value == PER_JOB for value in counts.values())
        base = statistics.median(baseline)
        added = statistics.median(s for _, s in healthy) - base
        print(f"baseline ray.shutdown(): median {base:.3f}s over {len(baseline)} jobs")
        print(f"healthy writer: median exit {base + added:.3f}s (adds {added:+.3f}s, target < 1 s); "
              f"jobs with {PER_JOB}/{PER_JOB} records: {kept}/{len(healthy)}")
        target("shutdown drain, healthy writer", added < 1.0, f"adds {added:+.3f}s (< 1 s)")
        target("nothing lost, healthy writer", kept == len(healthy), f"{kept}/{len(healthy)} jobs complete")

        from raysleuth.recorder import get_writer

        writer_pid = ray.get(get_writer().info.remote(), timeout=60)["pid"]
        os.kill(writer_pid, signal.SIGSTOP)
        try:
            gone = run_jobs(address, home, args.gone_repeats, "--driver-logs")
        finally:
            os.kill(writer_pid, signal.SIGCONT)
        counts = count_per_job(home, [job for job, _ in gone])
        kept = sum(value == PER_JOB for value in counts.values())
        worst = max(s for _, s in gone) - base
        print(f"writer gone (stopped): worst exit {base + worst:.3f}s (adds {worst:+.3f}s, target < 5 s); "
              f"jobs with {PER_JOB}/{PER_JOB} records once it is back: {kept}/{len(gone)}")
        target("shutdown drain, writer gone", worst < 5.0, f"adds {worst:+.3f}s at worst (< 5 s)")
        target("nothing lost, writer gone", kept == len(gone), f"{kept}/{len(gone)} jobs complete")
    finally:
        ray.shutdown()
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
