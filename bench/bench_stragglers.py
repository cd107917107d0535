"""What finding a straggler costs a healthy job, and how soon it is found once a rank turns slow (issue 26).

**Cost.** One local Ray, two gloo DDP groups of two actors, alike but for
raysleuth: *plain* runs as Ray starts it; *instrumented* gets the zero-code
worker setup (collective recording in light mode, the default: raysleuth's
light wrapper; torch's Flight Recorder as torch keeps it), the hook set per
actor; the actors are ``bench_zero_code_step.py``'s, each step a DDP step
that also all-reduces its loss for the log with the job's own
``dist.all_reduce`` (as training loops do; DDP's gradient buckets go through
C++, past the wrapper). Rounds take turns: plain, recorded (each
``BENCH_STEPS`` steps), and recorded while both instrumented ranks are
sampled the way ``raysleuth stragglers`` samples them (the default call:
``sampling._argv`` at ``sampling.RATE`` for ``sampling.SECONDS``), training
until the sampling ends; steps are timed inside the ranks.

Why CPU seconds and not step times: on the shared 2-core machine, with 2
ranks on its 2 cores, the best-of-rounds step time of two identical
conditions differs by tens of percent from run to run: the load swamps a 1%
effect (the step ratios stay printed, for scale). What the recording and the
sampling cost is read where the load cannot move it:

- **recording**, on the training thread: the collectives per step that went
  through raysleuth's wrapper (its progress count) times the CPU the wrapper
  adds to each, measured in the ranks' own training loop (the loss
  all-reduce goes in turn through the bare call, the wrapper and the bare
  call again, the A/A control, each timed in the training thread's CPU,
  ``time.thread_time_ns``, with the caches as the job's step leaves them;
  ``bench_collectives.py`` measures the same after 16 MiB of other memory
  traffic); plus the CPU of raysleuth's collectives thread per step
  (heartbeats), worst rank and round;
- **sampling**: py-spy's own rusage (``wait4``: its work per sample is
  fixed). Non-blocking, py-spy never stops a rank, so the most a rank's steps
  can slow down is the CPU py-spy takes from it: its sampler is one thread,
  so in a second of wall time it can displace at most its own CPU seconds of
  that second from a rank (where sampled processes outnumber a saturated
  node's cores, the job as a whole loses that times sampled / cores).
  py-spy's CPU over the ranks' own CPU in the window is printed too, but it
  is not the step's cost: the ranks wait in gloo for each other, and under
  load for a core, so py-spy runs in cycles they leave idle.

Targets: (1) py-spy uses < 1% of a core per process sampled, start-up
included; (2) a healthy job, where nobody is named and so nobody is
sampled, pays the recording alone: < 1% of the step time (the best recorded
round's), the wrapper's CPU per step and the collectives thread's, over the
step; (3) while a named rank is sampled, recording plus sampling < 1%: the
same plus the most CPU one py-spy took per second it sampled (worst process,
worst round). (2) and (3) count as missed unless the A/A control reads within 0.25% of
the step (what the ranks resolve). py-spy's split (start-up against per sample, from records at
1 and 10 Hz) is printed.

**Time to verdict.** A 2-rank job (``tests/victims/slow_ranks.py``, the
setup hook at job level as ``raysleuth run`` gives it) whose rank 1 turns
slow (4x slower batch reads) 10 s into training, watched by
``raysleuth watch --slow``'s check (:class:`raysleuth.stragglers.SlowWatch`,
every 1 s over a 5 s window, sampling the default way). Target: named, with its slow phase, < 20 s
after it turned slow.
"""

from __future__ import annotations

import json
import os
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

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "4"))
STEPS = int(os.environ.get("BENCH_STEPS", "600"))
SLOW_AFTER = 10.0


def _pid(_actor) -> int:
    return os.getpid()


def pids_of(group: list) -> list[int]:
    """The worker pids of a group's actors (asked inside each actor)."""
    from raysleuth.ray_private import ray_call

    return ray.get([ray_call(worker, _pid) for worker in group])


def _logged_train(actor, steps: int, timed: bool = False) -> tuple:
    """``steps`` DDP steps of the actor's model, each also all-reducing its loss for the log (the job's own
    ``dist.all_reduce``, as training loops do: DDP's gradient buckets go through C++, unwrapped). Per step:
    wall seconds, this process's CPU seconds, the CPU seconds of raysleuth's collectives thread, and the
    collectives that went through raysleuth's wrapper. ``timed``: the loss all-reduce goes in turn through the
    bare call, raysleuth's wrapper and the bare call again (the A/A control), each timed in the training
    thread's CPU (``time.thread_time_ns``) where the job's own step leaves the caches; their medians (ns) come
    fifth."""
    import threading

    import torch.distributed as dist

    hook = sys.modules.get("raysleuth.collectives.hook")
    ours = [t for t in threading.enumerate() if t.name == "raysleuth-collectives" and t.ident is not None]

    def thread_cpu() -> float:
        return sum(time.clock_gettime(time.pthread_getcpuclockid(t.ident)) for t in ours if t.is_alive())

    wrapped = dist.all_reduce
    bare = getattr(wrapped, "__wrapped__", wrapped)
    turns = [("bare", bare), ("light", wrapped), ("again", bare)] if timed else [("light", wrapped)]
    times: dict[str, list[int]] = {name: [] for name, _ in turns}
    functional, cpu_ns = actor.torch.nn.functional, time.thread_time_ns
    count = hook._progress[0] if hook else 0
    started, started_cpu, started_ours = time.perf_counter(), time.process_time(), thread_cpu()
    for step in range(steps):
        loss = functional.mse_loss(actor.model(actor.inputs), actor.targets)
        actor.optimizer.zero_grad()
        loss.backward()
        actor.optimizer.step()
        name, all_reduce = turns[step % len(turns)]
        begin = cpu_ns()
        all_reduce(loss.detach())
        times[name].append(cpu_ns() - begin)
    return ((time.perf_counter() - started) / steps, (time.process_time() - started_cpu) / steps,
            (thread_cpu() - started_ours) / steps, ((hook._progress[0] if hook else 0) - count) / steps,
            {name: statistics.median(values) for name, values in times.items()})


def per_step(results: list) -> tuple[float, float]:
    """(rank 0's wall seconds per step, every rank's CPU seconds per step summed) from the ranks' ``train``."""
    return results[0][0], sum(result[1] for result in results)


def train(group: list, steps: int) -> list:
    """Every rank's :func:`_logged_train` over ``steps`` steps."""
    from raysleuth.ray_private import ray_call

    return [ray_call(worker, _logged_train, steps) for worker in group]


def step_of(group: list, steps: int) -> tuple[float, float]:
    """Wall and CPU seconds per step over ``steps`` DDP steps (every rank trains)."""
    return per_step(ray.get(train(group, steps)))


def process_cpu(pid: int) -> float:
    """CPU seconds a process has used so far (every thread; the kernel's count, exact under load)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spy(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def spy_cpu(process: subprocess.Popen, block: bool = True) -> float | None:
    """CPU seconds this py-spy used (its own rusage, once it exited); None while it runs (``block=False``)."""
    pid, _, usage = os.wait4(process.pid, 0 if block else os.WNOHANG)
    return usage.ru_utime + usage.ru_stime if pid else None


def sampled_round(group: list, pids: list[int], py_spy: str) -> tuple[tuple, list[float], float, float]:
    """Train while py-spy samples every rank the default way, in rounds of 50 steps until the sampling ends;
    ((wall, CPU) per step, each py-spy's CPU seconds, seconds sampled per process, the ranks' CPU seconds
    in the same window)."""
    from raysleuth.stragglers.sampling import RATE, SECONDS, _argv

    refs = train(group, 50)
    time.sleep(0.2)  # training, before the first sample
    before = sum(process_cpu(pid) for pid in pids)
    spies = {index: spy(_argv(py_spy, pid, RATE, SECONDS)) for index, pid in enumerate(pids)}
    done: list[tuple[float, float]] = []
    cpu: list[float] = []
    while spies:
        done.append(per_step(ray.get(refs)))
        for index, process in list(spies.items()):
            used = spy_cpu(process, block=False)
            if used is not None:
                cpu.append(used)
                del spies[index]
        refs = train(group, 50) if spies else []
    ranks_cpu = sum(process_cpu(pid) for pid in pids) - before
    wall, cpu_per_step = (statistics.fmean(values) for values in zip(*done))
    return (wall, cpu_per_step), cpu, SECONDS, ranks_cpu


def print_spy_split(py_spy: str, pid: int) -> None:
    """py-spy's cost as start-up plus a cost per sample (2 s records at 1 and 10 Hz, 3 of each)."""
    from raysleuth.stragglers.sampling import RATE, SECONDS, _argv

    def median_cpu(rate: int) -> float:
        return statistics.median(spy_cpu(spy(_argv(py_spy, pid, rate, 2))) for _ in range(3))

    few, many = median_cpu(1), median_cpu(10)
    per_sample = (many - few) / (20 - 2)  # 21 samples against 3
    start = max(0.0, few - 3 * per_sample)
    samples = RATE * SECONDS + 1
    print(f"py-spy record on a rank of {len(os.listdir(f'/proc/{pid}/task'))} OS threads: {start * 1e3:.1f} ms CPU "
          f"to start (reading the process's maps and symbols), {per_sample * 1e3:.2f} ms per sample; the default "
          f"({RATE} Hz for {SECONDS:g} s, {samples:.0f} samples) so takes about "
          f"{(start + samples * per_sample) / SECONDS * 100:.2f}% of a core while it samples")


def measure_cost() -> None:
    from raysleuth.agents.host import find_tool

    py_spy = find_tool("py-spy")
    plain = make_group({"RAYSLEUTH_BENCH": "plain"})
    instrumented = make_group({"RAYSLEUTH_BENCH": "instrumented", HOOK_ENV: "raysleuth.setup_worker"})
    for group in (plain, instrumented):
        step_of(group, 20)  # warm up
    steps = STEPS
    pids = pids_of(instrumented)
    walls: dict[str, list[float]] = {"plain": [], "recorded": [], "recorded+sampled": []}
    cpus: dict[str, list[float]] = {name: [] for name in walls}
    spied_cpu, spy_seconds, ranks_cpu, worst = 0.0, 0.0, 0.0, 0.0
    thread_shares, wrapped_per_step = [], []
    for index in range(ROUNDS * 3):
        name = list(walls)[index % 3]  # each condition in turn
        if name == "recorded+sampled":
            step, cpu, seconds, ranks = sampled_round(instrumented, pids, py_spy)
            spied_cpu, spy_seconds = spied_cpu + sum(cpu), spy_seconds + seconds * len(cpu)
            ranks_cpu += ranks
            worst = max(worst, max(cpu) / seconds)
        else:
            results = ray.get(train(plain if name == "plain" else instrumented, steps))
            step = per_step(results)
            if name == "recorded":
                thread_shares.append(max(r[2] / r[0] for r in results))  # the collectives thread, per rank
                wrapped_per_step.append(max(r[3] for r in results))
        walls[name].append(step[0])
        cpus[name].append(step[1])
    print_steps(walls, cpus, steps)
    from raysleuth.ray_private import ray_call

    timed = [result[4] for result in ray.get([ray_call(worker, _logged_train, 3 * steps // 2, True)
                                              for worker in instrumented])]
    per_call = max(rank["light"] - rank["bare"] for rank in timed) / 1e9
    control = max((rank["again"] - rank["bare"] for rank in timed), key=abs) / 1e9
    share = spied_cpu / spy_seconds if spy_seconds else float("inf")
    against_ranks = spied_cpu / ranks_cpu if ranks_cpu else float("inf")
    print(f"py-spy: {spied_cpu * 1e3:.0f} ms CPU over {spy_seconds:g} s sampled; the sampled ranks used "
          f"{ranks_cpu:.2f} s CPU meanwhile")
    print_spy_split(py_spy, pids[0])
    print(f"py-spy's CPU over the sampled ranks' CPU in the same window: {against_ranks * 100:.3f}% (not the step's "
          f"cost: a rank that waits for its peer or for a core leaves py-spy idle cycles)")
    target("py-spy CPU per process sampled", share < 0.01, f"{share * 100:.3f}% of a core (< 1%)")
    step_wall = min(walls["recorded"])
    calls = max(wrapped_per_step)
    wrapper = calls * per_call / step_wall
    thread = max(thread_shares)
    print(f"recording per step: {calls:g} wrapped collective(s) per step x {per_call * 1e6:.2f} µs CPU each (the "
          f"wrapper's in the training thread, worst rank, median over the steps; the A/A control, the bare call "
          f"against itself, {control * 1e6:+.2f} µs = {control / step_wall * 100:+.3f}% of the step) = "
          f"{wrapper * 100:.3f}% of the "
          f"{step_wall * 1e3:.2f} ms step (best round); raysleuth's collectives thread {thread * 100:.3f}% "
          f"(worst rank and round); torch's Flight Recorder is torch's own default, on with or without raysleuth")
    print(f"sampling per step: at most the CPU one py-spy took per second it sampled, {worst * 100:.3f}% (worst "
          f"process and round: non-blocking, it never stops a rank)")
    total = wrapper + thread + worst
    resolved = abs(control) / step_wall <= 0.0025
    target("the ranks resolve the wrapper's cost (the A/A control within 0.25% of the step)", resolved,
           f"{control / step_wall * 100:+.3f}%")
    healthy = wrapper + thread  # nobody is named, so nobody is sampled (stragglers.collect.sample_phases)
    target("a healthy job (nobody named, so never sampled): collective recording, share of the step time",
           healthy < 0.01 and resolved, f"{healthy * 100:.3f}% (< 1%)")
    target("while a named rank is sampled: collective recording plus sampling, share of the step time",
           total < 0.01 and resolved, f"{total * 100:.3f}% (< 1%)")


def print_steps(walls: dict[str, list[float]], cpus: dict[str, list[float]], steps: int) -> None:
    """Step times and their ratios, printed for scale (the shared machine's load moves them more than the effect)."""
    for name, values in walls.items():
        print(f"DDP step, {name:17s} {min(values) * 1e3:7.3f} ms best, {statistics.median(values) * 1e3:7.3f} ms "
              f"median wall; {min(cpus[name]) * 1e3:7.3f} ms best CPU (ranks summed); {len(values)} rounds of "
              f"{steps} steps")
    best = {name: min(values) for name, values in walls.items()}
    cpu = {name: min(values) for name, values in cpus.items()}
    print(f"best-of-rounds ratios, printed for scale only (two identical conditions differ by tens of percent on "
          f"this machine): wall recorded/plain {best['recorded'] / best['plain']:.4f}, sampled/recorded "
          f"{best['recorded+sampled'] / best['recorded']:.4f}; "
          f"CPU recorded/plain {cpu['recorded'] / cpu['plain']:.4f}, "
          f"sampled/recorded {cpu['recorded+sampled'] / cpu['recorded']:.4f}")


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
        watch = SlowWatch(address, job=job, every=1.0, options=Options(window=5.0, wait=2.0))
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
          f"{phase.function + ' ' + phase.where if phase else '?'}"
          + (f" ({phase.share:.0%} of its {phase.samples} samples, {phase.peer_share:.0%} of its peers' "
             f"{phase.peer_samples})" if phase else "") + "".join(f"; {note}" for note in (report.notes if report else [])))
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
