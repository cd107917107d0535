"""Benchmark: is the verdict right, shape after shape, run after run? (issue 23)

Starts its own local Ray and runs every shape of tests/victims/verdict_shapes.py and
tests/victims/real_jobs.py several times, each as its own driver with no raysleuth inside
(``--hook`` runs give Ray raysleuth's worker setup hook, as ``raysleuth run`` does). Each run
calls ``raysleuth stacks --job JOB --json`` (the defaults: two samples, 2 s apart) as users do:

- a fault shape is right when a verdict with the expected state, root cause and exit code comes
  within ``SETTLE`` seconds of the victim's ``ready`` (the fault is in place by then): the time to it
  is the "time to verdict"; a verdict that names someone else first is wrong;
- a healthy shape is right when every one of its ``HEALTHY_CALLS`` verdicts exits 0 with progress
  seen (``busy``); any exit 1 is a false alarm.

Prints a table per shape: runs, accuracy, false alarms, median and worst time to verdict, then the
totals as a ratio of right verdicts to runs. There is no slower method to compare with here: the
measure is the expected answer itself (the verdict before this round, one rule per victim, was
recorded against several of these shapes in issue 23: "no culprit, exit 0" on the stuck async
engine and the actor cycle, every rank blamed on the sleeping loop). Exits 1 below 100 % accuracy
or above 0 false alarms.

``python bench/bench_verdicts.py [--runs N] [--healthy-runs N] [--only SHAPE ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(HERE))

from _targets import exit_code, target  # noqa: E402

SETTLE = 60.0
HEALTHY_CALLS = 2


def _fault(state, ranks=None, rule=None, classes=None):
    def check(code: int, verdict: dict) -> bool:
        if verdict["state"] != state or code != 1:
            return False
        culprits = verdict["culprits"]
        if ranks is not None and sorted(c["rank"] for c in culprits) != ranks:
            return False
        if rule is not None and any(c["rule"] != rule for c in culprits):
            return False
        return classes is None or sorted(c["actor_class"] for c in culprits) == classes
    return check


# name -> (module, shape args, healthy?, check)
SHAPES = {
    "async engine stuck (setup hook)": ("victims.verdict_shapes", ["async_stuck", "--hook"], False,
                                        _fault("culprit", rule="coroutine")),
    "async engine stuck (outside)": ("victims.verdict_shapes", ["async_stuck"], False, _fault("hung", ranks=[])),
    "async engine healthy": ("victims.verdict_shapes", ["async_healthy"], True, None),
    "actor call cycle": ("victims.verdict_shapes", ["cycle"], False,
                         _fault("deadlock", classes=["Learner", "ParamServer"])),
    "actor call blocked on an Event": ("victims.verdict_shapes", ["blocked_call"], False,
                                       _fault("culprit", rule="wait-for chain", classes=["Loader"])),
    "DDP loop sleeping 50 ms (outside)": ("victims.verdict_shapes", ["ddp_sleep"], True, None),
    "DDP loop sleeping 50 ms (setup hook)": ("victims.verdict_shapes", ["ddp_sleep", "--hook"], True, None),
    "rank spinning while peers wait": ("victims.verdict_shapes", ["spin"], False, _fault("culprit", ranks=[1])),
    "ops differ (broadcast vs all_reduce)": ("victims.verdict_shapes", ["op_mismatch"], False,
                                             _fault("culprit", ranks=[1])),
    "checkpoint barrier of 8 s": ("victims.verdict_shapes", ["checkpoint"], True, None),
    "gloo rank stuck before the collective": ("victims.real_jobs", ["gloo", "--workers", "3", "--stuck-rank", "1"],
                                              False, _fault("culprit", ranks=[1], rule="peers")),
    "gloo ranks in swapped collectives": ("victims.real_jobs", ["gloo", "--workers", "3", "--swap-rank", "2"], False,
                                          _fault("hung", ranks=[])),
    "parameter server rank dies (SIGKILL)": ("victims.real_jobs", ["ps", "--workers", "3", "--die-rank", "1"], False,
                                             _fault("culprit", ranks=[1], rule="dead peer")),
    "gloo healthy": ("victims.real_jobs", ["gloo", "--workers", "3", "--seconds", "900"], True, None),
    "Ray Train rank stuck": ("victims.real_jobs", ["train", "--workers", "2", "--stuck-rank", "1"], False,
                             _fault("culprit", ranks=[1], rule="peers")),
    "Ray Train healthy (controller polls every 2 s)": ("victims.real_jobs", ["train", "--workers", "2", "--seconds",
                                                                             "900"], True, None),
}


def _stacks(address: str, job: str) -> tuple[int, dict]:
    from raysleuth.cli import main

    out = StringIO()
    with redirect_stdout(out):
        code = main(["stacks", "--address", address, "--json", "--no-record", "--job", job])
    return code, json.loads(out.getvalue())


def run_shape(address: str, name: str, runs: int) -> dict:
    from victim_process import Victim

    module, args, healthy, check = SHAPES[name]
    right, false_alarms, times, wrong = 0, 0, [], []
    for _ in range(runs):
        victim = Victim(address, args[0], *args[1:], module=module).ready()
        if args[0] == "train":  # its `ready` comes before fit(): judged once its workers run, as on a running job
            victim.wait_for("RayTrainWorker", 2)
        onset = time.monotonic()
        try:
            if healthy:
                codes = [_stacks(address, victim.job_id) for _ in range(HEALTHY_CALLS)]
                alarms = [v for c, v in codes if c != 0 or v["verdict"]["state"] != "busy"]
                false_alarms += bool(alarms)
                right += not alarms
                if alarms:
                    wrong.append(alarms[0]["verdict"]["summary"][:160])
                continue
            verdict, code = None, None
            while time.monotonic() - onset < SETTLE:
                code, data = _stacks(address, victim.job_id)
                verdict = data["verdict"]
                if check(code, verdict):
                    right += 1
                    times.append(time.monotonic() - onset)
                    break
                if verdict["culprits"]:  # someone else named: wrong, and users act on the first name
                    break
            else:
                pass
            if not times or len(times) < right or not check(code, verdict):
                wrong.append(f"exit {code}: {verdict['summary'][:160] if verdict else '?'}")
        finally:
            victim.stop()
    return {"shape": name, "runs": runs, "right": right, "false_alarms": false_alarms, "healthy": healthy,
            "times": times, "wrong": wrong}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each fault shape")
    parser.add_argument("--healthy-runs", type=int, default=5, help="runs of each healthy shape")
    parser.add_argument("--only", nargs="*", help="shape names (substrings) to run")
    args = parser.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])
    home = Path(os.environ.setdefault("RAYSLEUTH_HOME", str(Path("/tmp") / f"raysleuth-bench-verdicts-{os.getpid()}")))
    home.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "include_dashboard": True})
    ray.init(address=cluster.address, log_to_driver=False)
    results = []
    try:
        for name in SHAPES:
            if args.only and not any(part in name for part in args.only):
                continue
            results.append(run_shape(cluster.address, name, args.healthy_runs if SHAPES[name][2] else args.runs))
            print(_row(results[-1]), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    runs = sum(r["runs"] for r in results)
    right = sum(r["right"] for r in results)
    alarms = sum(r["false_alarms"] for r in results)
    print(f"\n{runs} runs of {len(results)} shapes: {right} right ({100 * right / max(runs, 1):.0f}%), "
          f"{alarms} false alarm(s)")
    target("verdict accuracy", right == runs and runs > 0, f"{right}/{runs} right (target 100%)")
    target("false alarms", alarms == 0, f"{alarms} on the healthy shapes (target 0)")
    return exit_code()


def _row(result: dict) -> str:
    times = result["times"]
    timing = (f"to verdict median {statistics.median(times):.1f}s, worst {max(times):.1f}s" if times
              else ("healthy" if result["healthy"] else "no right verdict"))
    line = (f"{result['shape']:<42} {result['right']}/{result['runs']} right, "
            f"{result['false_alarms']} false alarm(s), {timing}")
    for text in result["wrong"][:2]:
        line += f"\n    wrong: {text}"
    return line


if __name__ == "__main__":
    sys.exit(main())
