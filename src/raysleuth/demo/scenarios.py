"""The demo's scenarios: inject one fault, then diagnose it with the matching raysleuth command.

Each runner takes the :class:`~raysleuth.demo.job.JobConfig` and a progress
callback and returns a :class:`~raysleuth.demo.runner.ScenarioResult`. It
kills its actors before returning (a hung one too). Diagnoses use the same
functions the CLI commands call (``raysleuth stacks`` → ``dump_stacks``,
``raysleuth memory`` → ``memory_report``, ...), and only judge this
scenario's own workers (other jobs may share the cluster).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import raysleuth as rs
from raysleuth import evidence as rs_evidence
from raysleuth.demo.harness import Job, ScenarioResult, flush_evidence
from raysleuth.demo.job import Fault, JobConfig, RolloutWorker, policy_weights
from raysleuth.explain import WRAPPER, innermost_exception
from raysleuth.ray_private import actor_id_hex

__all__ = ["EXPECTED", "FOUND_BY", "INJECTED", "RUNNERS", "SCENARIOS"]

SCENARIOS = ("healthy", "hang", "diverge", "leak", "crash", "pending")

INJECTED = {
    "healthy": "nothing (3 trainer ranks, GRPO)",
    "hang": "rank 1 stuck before the gradient exchange (step 2)",
    "diverge": "rank 2 initialised with a different seed",
    "leak": "rank 1 keeps a reference to every batch",
    "crash": "rank 1 raises inside update (step 2)",
    "pending": "a rollout worker asking for a GPU that does not exist",
}
FOUND_BY = {
    "healthy": "stacks + consistency + memory + crashes + tasks",
    "hang": "raysleuth stacks (dump_stacks)",
    "diverge": "rs.check_distributed_consistency + rs.compare",
    "leak": "raysleuth memory (memory_report)",
    "crash": "raysleuth crashes + raysleuth explain",
    "pending": "raysleuth tasks --pending (find_tasks)",
}
EXPECTED = {
    "healthy": "nothing flagged",
    "hang": "culprit rank 1",
    "diverge": "outlier rank 2, tensors named",
    "leak": "leak on rank 1 only",
    "crash": "capsule from rank 1, explained",
    "pending": "infeasible, GPU",
}

Say = Callable[[str], None]


def _result(name: str, **fields: Any) -> ScenarioResult:
    return ScenarioResult(scenario=name, injected=INJECTED[name], found_by=fields.pop("found_by", FOUND_BY[name]),
                          expected=EXPECTED[name], **fields)


def _store_path() -> str:
    store = rs.open_store()
    try:
        return str(store.path)
    finally:
        store.close()


def _settle(seconds: float = 1.0) -> None:
    """Let the workers' batching clients deliver (they send every 0.2 s)."""
    flush_evidence()
    time.sleep(seconds)


# ------------------------------------------------------------------ checks


def _stack_culprits(job: Job, timeout: float = 45.0) -> tuple[list[int], str, Any]:
    report = rs.dump_stacks(timeout=timeout)
    rs.record("stack_report", report.to_dict(), name=f"demo-{job.scenario}",
              level="ERROR" if report.verdict.culprits else "INFO")
    rank_of_pid = {pid: rank for rank, pid in job.pids.items()}
    ours = [c for c in report.verdict.culprits if c.pid in rank_of_pid]
    ranks = sorted({c.rank if c.rank is not None else rank_of_pid[c.pid] for c in ours})
    text = "; ".join(f"{_job_frame(report, c.pid)}{c.reason}" for c in ours) or report.verdict.summary
    return ranks, text, report


def _job_frame(report: Any, pid: int) -> str:
    """``in GRPOTrainer._wait_for_gradient_bucket (job.py:212), `` — the job's own innermost frame.

    raysleuth's stack verdict skips raysleuth's own files as library code, and
    the demo's job lives inside raysleuth; a user's job would be named directly.
    """
    process = report.process(pid)
    for thread in process.threads if process is not None else []:
        for frame in thread.frames:
            if frame.file.replace("\\", "/").endswith("demo/job.py"):
                return f"in {frame.function} (job.py:{frame.line}), "
    return ""


def _consistency_rows(name: str, since: float) -> list[Any]:
    store = rs.open_store(_store_path())
    try:
        return [r for r in rs_evidence.read(store, rs_evidence.Consistency, since=since) if r.key.startswith(f"{name}/")]
    finally:
        store.close()


def _memory_leaks(job: Job, since: float) -> tuple[list[int], list[Any]]:
    store = rs.open_store(_store_path())
    try:
        report = rs.memory_report(store, since=since)
    finally:
        store.close()
    rank_of_pid = {pid: rank for rank, pid in job.pids.items()}
    ours = [w for w in report.workers if w.pid in rank_of_pid]
    return sorted({rank_of_pid[w.pid] for w in ours if w.leak}), ours


def _crashes(since: float, pids: set[int]) -> list[Any]:
    return [c for c in rs.list_crashes(run=_store_path()) if c.time >= since and c.pid in pids]


# ------------------------------------------------------------------ scenarios


def healthy(config: JobConfig, say: Say) -> ScenarioResult:
    """No fault: every check must come back clean."""
    since = time.time()
    job = Job("healthy", config, Fault())
    try:
        say(f"  training {config.steps} GRPO steps on {config.world_size} ranks")
        outcome = job.run(config.steps)
        job.flush()
        _settle()
        flags: list[str] = []
        notes: list[str] = []
        if outcome.steps_done != config.steps:
            flags.append(f"job stopped at step {outcome.steps_done} ({outcome.error or 'hung'})")
        say("  raysleuth stacks")
        ranks, text, _ = _stack_culprits(job)
        if ranks:
            flags.append(f"stacks blamed ranks {ranks}: {text}")
        else:
            notes.append("stacks: no culprit")
        rows = _consistency_rows("healthy", since)
        bad = [r for r in rows if r.consistent is False]
        if bad:
            flags.append(f"{len(bad)} consistency checks mismatched")
        notes.append(f"{len(rows)} consistency checks consistent" if not bad else "")
        say("  raysleuth memory")
        leaks, _ = _memory_leaks(job, since)
        if leaks:
            flags.append(f"memory leak verdict on ranks {leaks}")
        else:
            notes.append("no leak")
        crashes = _crashes(since, set(job.pids.values()))
        if crashes:
            flags.append(f"{len(crashes)} crash capsules")
        else:
            notes.append("no crash")
        say("  raysleuth tasks --pending")
        report = rs.find_tasks(pending=True, stuck=False, failed=False, dead=False, older_than=60.0)
        ours = job.actor_ids()
        # Only this job's work: other jobs on a shared cluster may wait for what they like.
        infeasible = [p for p in report.pending if p.reason == "infeasible"
                      and (p.actor_id in ours or "score_group" in (p.name or ""))]
        if infeasible:
            flags.append(f"{len(infeasible)} infeasible pending tasks")
        else:
            notes.append("nothing infeasible")
        verdict = "; ".join(flags) if flags else "nothing flagged: " + ", ".join(n for n in notes if n)
        return _result("healthy", verdict=verdict, correct=not flags, steps_run=outcome.steps_done,
                       details={"flags": flags, "notes": notes})
    finally:
        job.kill()


def hang(config: JobConfig, say: Say) -> ScenarioResult:
    """Rank 1 never reaches the gradient exchange; ``dump_stacks`` must name it."""
    fault = Fault(kind="hang", rank=1, step=2)
    job = Job("hang", config, fault)
    try:
        outcome = job.run(config.steps, step_timeout=6.0)
        if outcome.hung_step is None:
            return _result("hang", verdict=f"the job did not hang ({outcome.steps_done} steps)", correct=False,
                           steps_run=outcome.steps_done)
        say(f"  step {outcome.hung_step} did not finish within 6 s: raysleuth stacks")
        _settle(0.5)
        ranks, text, report = _stack_culprits(job)
        correct = ranks == [fault.rank]
        verdict = f"culprit rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks)) or 'none'}: {text}"
        return _result("hang", verdict=verdict, correct=correct, culprit_ranks=ranks, steps_run=outcome.steps_done,
                       details={"summary": report.verdict.summary, "groups": [g.headline for g in report.groups][:6],
                                "missing": [str(m) for m in report.missing][:6]})
    finally:
        job.kill()


def diverge(config: JobConfig, say: Say) -> ScenarioResult:
    """Rank 2 starts from other weights; the consistency checks must name it and the tensors."""
    since = time.time()
    fault = Fault(kind="diverge", rank=2)
    job = Job("diverge", config, fault)
    try:
        steps = min(config.steps, 6)
        outcome = job.run(steps)
        say("  rs.compare(trainers, policy_weights) from the driver")
        report = rs.compare(job.trainers, policy_weights, key="diverge/compare", timeout=60)
        job.flush()
        _settle()
        in_rank = [r for r in _consistency_rows("diverge", since) if r.consistent is False]
        in_rank_outliers = sorted({rank for r in in_rank for rank in r.outlier_ranks})
        tensors = [m.name for m in report.mismatches]
        first = report.mismatches[0] if report.mismatches else None
        correct = (not report.consistent and report.outlier_ranks == [fault.rank] and bool(tensors)
                   and (not in_rank or in_rank_outliers == [fault.rank]))
        where = f", first at {tuple(first.first_index)}" if first and first.first_index is not None else ""
        verdict = (f"outlier rank{'s' if len(report.outlier_ranks) != 1 else ''} "
                   f"{', '.join(map(str, report.outlier_ranks)) or 'none'}: {len(tensors)} tensors differ "
                   f"({', '.join(tensors[:2])}{'…' if len(tensors) > 2 else ''}{where}); "
                   f"in-rank checks: {len(in_rank)} mismatches")
        return _result("diverge", verdict=verdict, correct=correct, culprit_ranks=report.outlier_ranks,
                       steps_run=outcome.steps_done,
                       details={"summary": report.summary(), "in_rank_outliers": in_rank_outliers})
    finally:
        job.kill()


def leak(config: JobConfig, say: Say) -> ScenarioResult:
    """Rank 1 keeps every batch; ``raysleuth memory`` must call a leak on rank 1 only."""
    since = time.time()
    fault = Fault(kind="leak", rank=1)
    job = Job("leak", config, fault)
    try:
        steps = max(config.steps, 30)
        say(f"  training {steps} steps while rank 1 keeps every batch")
        outcome = job.run(steps, min_seconds=4.0, max_steps=60)
        job.flush()  # stops each rank's sampler: the window is the training itself
        _settle()
        say("  raysleuth memory")
        ranks, workers = _memory_leaks(job, since)
        leaking = [w for w in workers if w.leak]
        reason = "; ".join(f"rank {job_rank(job, w.pid)}: {w.reason}" for w in leaking) or "no leak"
        return _result("leak", verdict=f"leak on rank{'s' if len(ranks) != 1 else ''} "
                                       f"{', '.join(map(str, ranks)) or 'none'} — {reason}",
                       correct=ranks == [fault.rank], culprit_ranks=ranks, steps_run=outcome.steps_done,
                       details={"workers": [{"rank": job_rank(job, w.pid), "leak": w.leak, "reason": w.reason,
                                             "samples": w.samples} for w in workers]})
    finally:
        job.kill()


def job_rank(job: Job, pid: int | None) -> int | None:
    """The rank of one of the job's trainer pids."""
    return next((rank for rank, known in job.pids.items() if known == pid), None)


def crash(config: JobConfig, say: Say) -> ScenarioResult:
    """Rank 1 raises in ``update``; a crash capsule must name rank 1, and ``explain`` the error."""
    since = time.time()
    fault = Fault(kind="crash", rank=1, step=2)
    job = Job("crash", config, fault)
    try:
        outcome = job.run(config.steps)
        if outcome.error is None:
            return _result("crash", verdict="the job did not crash", correct=False, steps_run=outcome.steps_done)
        say(f"  the job failed at step {outcome.steps_done}: raysleuth crashes")
        _settle()
        crashes = _crashes(since, set(job.pids.values()))
        ranks = sorted({c.rank for c in crashes if c.rank is not None})
        matches = rs.explain_error(outcome.error)
        title = matches[0].title if matches else "no known cause"
        if matches and matches[0].id == WRAPPER:  # the wrapper alone explains nothing: name what it wraps
            inner = innermost_exception(str(outcome.error))
            title = (f"{inner} raised in the worker (Ray re-raised it as RayTaskError; no known cause beyond it: "
                     "read its capsule)" if inner else title)
        first = crashes[0] if crashes else None
        text = (f"{first.exception_type} on rank {first.rank} in {first.method}: {first.message}"
                if first else "no capsule")
        correct = ranks == [fault.rank] and first is not None and first.exception_type.endswith("ValueError")
        return _result("crash", verdict=f"{text}; explain: {title}", correct=correct, culprit_ranks=ranks,
                       steps_run=outcome.steps_done,
                       details={"capsules": [c.to_dict() for c in crashes], "explain": [m.to_dict() for m in matches]})
    finally:
        job.kill()


def pending(config: JobConfig, say: Say) -> ScenarioResult:
    """A rollout worker asks for a GPU; ``raysleuth tasks --pending`` must say infeasible, GPU."""
    import ray

    worker_class = ray.remote(num_gpus=1, num_cpus=1)(RolloutWorker)
    actor: Any = worker_class.options(name=f"demo-pending-gpu-rollout-{int(time.time())}").remote(config.seed)
    actor_id = actor_id_hex(actor)
    try:
        say("  raysleuth tasks --pending")
        deadline = time.monotonic() + 30
        found = None
        report = None
        while time.monotonic() < deadline:
            report = rs.find_tasks(pending=True, stuck=False, failed=False, dead=False, older_than=0.0)
            found = next((p for p in report.pending if p.actor_id == actor_id), None)
            if found is not None and found.reason != "unknown":
                break
            time.sleep(1.0)
        if found is None:
            return _result("pending", verdict="the GPU worker was not listed as pending", correct=False)
        _record_tasks(report)
        wants_gpu = "GPU" in (found.required_resources or {}) or "GPU" in found.detail
        correct = found.reason == "infeasible" and wants_gpu
        return _result("pending", verdict=f"{found.name}: {found.reason} — {found.detail}", correct=correct,
                       details={"pending": [p.__dict__ for p in (report.pending if report else [])][:5]})
    finally:
        ray.kill(actor, no_restart=True)


def _record_tasks(report: Any) -> None:
    """Keep what ``tasks --pending`` said as evidence (kind ``tasks``), for the report."""
    rs.record("tasks", report.to_dict(), name="tasks --pending", level="WARNING" if report.problem else "INFO")
    flush_evidence()


RUNNERS: dict[str, Callable[[JobConfig, Say], ScenarioResult]] = {
    "healthy": healthy,
    "hang": hang,
    "diverge": diverge,
    "leak": leak,
    "crash": crash,
    "pending": pending,
}
