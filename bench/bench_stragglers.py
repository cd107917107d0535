"""What finding a straggler costs a healthy job, and how soon it is found once a rank turns slow (issue 26).

**Cost.** One local Ray, two gloo DDP groups of two actors, alike but for
raysleuth: *plain* runs as Ray starts it; *instrumented* gets the zero-code
worker setup (collective recording: torch's Flight Recorder and the
collective wrapper), the hook set per actor; the actors are
``bench_zero_code_step.py``'s. Each round trains both groups the same number of steps, timed inside
rank 0; in every other round both instrumented ranks are sampled the way
``raysleuth stragglers`` samples them (``py-spy record --nonblocking``, 5 Hz,
the same argv). py-spy's CPU time is read from the kernel (its children's
rusage: exact under load).

Targets, on best-of-rounds step times (the rounds' medians carry the shared
machine's load): (1) sampling adds < 1% per step (sampled against unsampled
rounds of the same recorded ranks); (2) recording plus sampling adds < 1%
per step (against plain); (3) py-spy uses < 1% of a core per process
sampled (the most it can take from a rank's step, and only while it
samples: a healthy job, where nobody is named, is not sampled at all).

**Time to verdict.** A 2-rank job (``tests/victims/slow_ranks.py``, the
setup hook at job level as ``raysleuth run`` gives it) whose rank 1 turns
slow (4x slower batch reads) 10 s into training, watched by
``raysleuth watch --slow``'s check (:class:`raysleuth.stragglers.SlowWatch`,
every 1 s over a 5 s window). Target: named, with its slow phase, < 20 s
after it turned slow.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

import ray  # noqa: E402

from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)
from bench_zero_code_step import HOOK_ENV, make_group  # noqa: E402  (the same DDP actors)

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "6"))
STEPS = int(os.environ.get("BENCH_STEPS", "600"))  # a round outlasts the 3 s of sampling
SLOW_AFTER = 10.0


def _pid(_actor) -> int:
    return os.getpid()


def pids_of(group: list) -> list[int]:
    """The worker pids of a group's actors (asked inside each actor)."""
    from raysleuth.ray_private import ray_call

    return ray.get([ray_call(worker, _pid) for worker in group])


def step_of(group: list) -> float:
    """Rank 0's wall seconds per step over ``STEPS`` DDP steps (every rank trains)."""
    return ray.get([worker.train.remote(STEPS) for worker in group])[0][0]


def sampled_round(group: list, pids: list[int], py_spy: str) -> tuple[float, float, float]:
    """Train while py-spy samples every rank; (step seconds, py-spy CPU seconds, seconds sampled per process)."""
    from raysleuth.stragglers.sampling import RATE, _argv

    seconds = 3.0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spies = [subprocess.Popen(_argv(py_spy, pid, RATE, seconds), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for pid in pids]
    step = step_of(group)
    for spy in spies:
        spy.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return step, cpu, seconds * len(pids)


def spy_cpu(py_spy: str, pid: int, seconds: int) -> float:
    """CPU seconds one ``py-spy record`` of ``seconds`` takes (its rusage)."""
    from raysleuth.stragglers.sampling import RATE, _argv

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(_argv(py_spy, pid, RATE, seconds), capture_output=True, timeout=seconds + 30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def print_spy_split(py_spy: str, pid: int) -> None:
    """py-spy's cost as start-up plus a cost per second sampled (from a 1 s and a 4 s record, 3 of each)."""
    short = statistics.median(spy_cpu(py_spy, pid, 1) for _ in range(3))
    long = statistics.median(spy_cpu(py_spy, pid, 4) for _ in range(3))
    per_second = (long - short) / 3
    print(f"py-spy record at 5 Hz: {max(0.0, short - per_second) * 1e3:.1f} ms CPU to start (reading the "
          f"process's symbols), then {per_second * 1e3:.2f} ms per second sampled ({per_second * 100:.2f}% of a core)")


def measure_cost() -> None:
    from raysleuth.agents.host import find_tool

    py_spy = find_tool("py-spy")
    plain = make_group({"RAYSLEUTH_BENCH": "plain"})
    instrumented = make_group({"RAYSLEUTH_BENCH": "instrumented", HOOK_ENV: "raysleuth.setup_worker"})
    for group in (plain, instrumented):
        ray.get([worker.train.remote(20) for worker in group])  # warm up
    pids = pids_of(instrumented)
    walls: dict[str, list[float]] = {"plain": [], "recorded": [], "recorded+sampled": []}
    spied_cpu, spy_seconds = 0.0, 0.0
    for index in range(ROUNDS):
        names = list(walls)
        for name in names[index % 3:] + names[:index % 3]:  # each condition goes first in turn
            if name == "recorded+sampled":
                step, cpu, seconds = sampled_round(instrumented, pids, py_spy)
                walls[name].append(step)
                spied_cpu, spy_seconds = spied_cpu + cpu, spy_seconds + seconds
            else:
                walls[name].append(step_of(plain if name == "plain" else instrumented))
    for name, values in walls.items():
        print(f"DDP step, {name:17s} {min(values) * 1e3:7.3f} ms best, {statistics.median(values) * 1e3:7.3f} ms "
              f"median of {len(values)} rounds of {STEPS} steps")
    best = {name: min(values) for name, values in walls.items()}
    recorded, sampled = best["recorded"] / best["plain"], best["recorded+sampled"] / best["recorded"]
    total = best["recorded+sampled"] / best["plain"]
    print(f"best-of-rounds ratios: recorded/plain {recorded:.4f}, sampled/recorded {sampled:.4f}, "
          f"recorded+sampled/plain {total:.4f}")
    share = spied_cpu / spy_seconds if spy_seconds else float("inf")
    print_spy_split(py_spy, pids[0])
    target("sampling per step (best of rounds, same recorded ranks)", sampled < 1.01, f"x{sampled:.4f} (< x1.01)")
    target("recording + sampling per step (best of rounds)", total < 1.01, f"x{total:.4f} (< x1.01)")
    target("py-spy CPU per process sampled", share < 0.01, f"{share * 100:.3f}% of a core at 5 Hz (< 1%)")


def measure_time_to_verdict(address: str) -> None:
    from raysleuth.stragglers import SlowWatch
    from raysleuth.stragglers.collect import Options

    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])
    runtime_env = {"worker_process_setup_hook": "raysleuth.setup_worker",
                   "env_vars": {"RAYSLEUTH_MODE": "light", "PYTHONPATH": path,
                                "RAYSLEUTH_HOME": os.environ["RAYSLEUTH_HOME"]}}
    env = dict(os.environ, PYTHONPATH=path, RAY_JOB_CONFIG_JSON_ENV_VAR=json.dumps({"runtime_env": runtime_env}))
    driver = subprocess.Popen([sys.executable, "-m", "victims.slow_ranks", "--slow", "data", "--slow-rank", "1",
                               "--world-size", "2", "--slow-after", str(SLOW_AFTER), "--address", address],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=str(ROOT / "tests"))
    try:
        job = next(line.split()[1] for line in driver.stdout if line.startswith("training"))
        onset = time.monotonic() + SLOW_AFTER
        watch = SlowWatch(address, job=job, every=1.0, options=Options(window=5.0, sample=2.0, wait=2.0))
        report, early = None, []
        while report is None and time.monotonic() < onset + 60:
            report = watch.tick()
            if report is not None and time.monotonic() < onset:
                early.append(report.summary)  # named before it was slow: a false alarm
            time.sleep(0.2)
    finally:
        driver.kill()
        driver.wait()
    found = time.monotonic() - onset
    named = [s.rank for s in report.stragglers] if report else []
    phase = report.stragglers[0].phase if report and report.stragglers else None
    print(f"rank turned slow at +{SLOW_AFTER:g}s; named {named} {found:.1f}s later, slow in "
          f"{phase.function + ' ' + phase.where if phase else '?'}")
    target("time to verdict after a rank turns slow", named == [1] and not early and phase is not None and found < 20,
           f"{found:.1f}s (< 20 s), no alarm before it turned slow: {not early}")


def main() -> int:
    os.environ["RAYSLEUTH_HOME"] = tempfile.mkdtemp(prefix="rs-bench-stragglers-")
    os.environ["RAYSLEUTH_MODE"] = "light"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    context = ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        measure_cost()
        measure_time_to_verdict(context.address_info["address"])
    finally:
        ray.shutdown()
    return exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
