"""What raysleuth's zero-code setup adds to a Ray worker's start-up, against Ray's own start-up, in one run.

One local Ray. In interleaved rounds, an actor is started without the setup
(baseline: a runtime_env of its own, so it too gets a fresh process) and with
``worker_process_setup_hook`` = raysleuth's setup (what ``raysleuth run`` and
the direct ways give every worker), and timed from ``.remote()`` to its first
method's return.

Two figures:

- **setup on the start-up path** (target < 50 ms): measured inside the
  worker, ``import raysleuth`` + ``raysleuth.setup_worker()`` — Ray waits for
  the hook before the worker takes its first task, so this is what the setup
  adds to Ray's worker start-up. Judged on the main thread's CPU time (what
  it costs on a quiet machine); the wall time is printed beside it. The slower part (the memory
  sampler) runs two seconds later on the control thread; their wall time is
  printed too.
- **end to end**: median start-up with the setup minus without. On a busy
  machine Ray's own start-up varies by far more than 50 ms, so this is
  printed for scale, not judged.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import ray  # noqa: E402

from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)

TARGET_MS = 50.0
#: What Ray turns a job's ``worker_process_setup_hook`` into for each worker (a per-actor
#: runtime_env cannot carry the hook itself, and both kinds of actor must share one cluster).
HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "8"))


def timed_setup() -> None:
    """The hook, timed: what Ray runs in each new worker before its first task.

    Given to Ray by module path (``bench_worker_setup.timed_setup``, bench/ on
    the workers' PYTHONPATH), as users give ``raysleuth.setup_worker``.
    """
    started, started_cpu = time.perf_counter(), time.thread_time()
    import raysleuth

    raysleuth.setup_worker()
    os.environ["RAYSLEUTH_BENCH_SETUP_MS"] = str((time.perf_counter() - started) * 1000)
    os.environ["RAYSLEUTH_BENCH_SETUP_CPU_MS"] = str((time.thread_time() - started_cpu) * 1000)


@ray.remote(num_cpus=0)
class Probe:
    def report(self, wait_s: float) -> dict:
        time.sleep(wait_s)  # let the control thread finish the deferred parts
        timings = {}
        if "raysleuth.worker_setup" in sys.modules:
            from raysleuth.worker_setup import setup_report

            timings = setup_report()["timings_ms"]
        return {"setup_ms": float(os.environ.get("RAYSLEUTH_BENCH_SETUP_MS", "nan")),
                "setup_cpu_ms": float(os.environ.get("RAYSLEUTH_BENCH_SETUP_CPU_MS", "nan")), "timings": timings}


def start_once(runtime_env: dict) -> tuple[float, dict]:
    started = time.perf_counter()
    actor = Probe.options(runtime_env=runtime_env).remote()
    ray.get(actor.__ray_ready__.remote())
    elapsed = (time.perf_counter() - started) * 1000
    report = ray.get(actor.report.remote(2.0))
    ray.kill(actor)
    return elapsed, report


def main() -> int:
    home = tempfile.mkdtemp(prefix="rs-bench-setup-")
    os.environ["RAYSLEUTH_HOME"] = home
    here = Path(__file__).resolve().parent
    os.environ["PYTHONPATH"] = os.pathsep.join([str(here.parent / "src"), str(here), os.environ.get("PYTHONPATH", "")])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    baseline, hooked, setup, setup_cpu, deferred = [], [], [], [], []
    start_once({"env_vars": {"RAYSLEUTH_BENCH": "warm-up"}})
    for index in range(ROUNDS):
        for kind in (("base", "hook") if index % 2 == 0 else ("hook", "base")):
            if kind == "base":
                elapsed, _ = start_once({"env_vars": {"RAYSLEUTH_BENCH": f"base-{index}"}})
                baseline.append(elapsed)
            else:
                elapsed, report = start_once({"env_vars": {HOOK_ENV: "bench_worker_setup.timed_setup",
                                                           "RAYSLEUTH_BENCH": f"hook-{index}"}})
                hooked.append(elapsed)
                setup.append(report["setup_ms"])
                setup_cpu.append(report["setup_cpu_ms"])
                timings = report["timings"]
                deferred.append(timings.get("mode", 0.0))
    ray.shutdown()
    base_ms, hook_ms = statistics.median(baseline), statistics.median(hooked)
    setup_ms, cpu_ms = statistics.median(setup), statistics.median(setup_cpu)
    print(f"worker start-up, Ray alone:            {base_ms:8.1f} ms (median of {len(baseline)})")
    print(f"worker start-up, with raysleuth setup: {hook_ms:8.1f} ms (median of {len(hooked)}; "
          f"{hook_ms - base_ms:+.1f} ms, ratio {hook_ms / base_ms:.3f}; noisy, not judged)")
    print(f"setup on the start-up path (import + setup_worker): {cpu_ms:6.1f} ms CPU median "
          f"({min(setup_cpu):.1f}..{max(setup_cpu):.1f}), {setup_ms:.1f} ms wall median "
          f"({min(setup):.1f}..{max(setup):.1f}; wall waits for the CPU on a busy machine); "
          f"{setup_ms / base_ms * 100:.1f}% of Ray's start-up")
    print(f"deferred parts on the control thread (mode: memory sampler): "
          f"{statistics.median(deferred):6.1f} ms wall median, off the start-up path")
    target("setup per worker start", cpu_ms < TARGET_MS, f"{cpu_ms:.1f} ms CPU (< {TARGET_MS:.0f} ms)")
    return exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
