"""Run the demo job under faults and diagnose each one with raysleuth, as a user would.

:func:`run_demo` connects to Ray once (an already-connected Ray in this
process, else ``--address``, else a fresh embedded local Ray — never some
other cluster found by ``auto``), runs each scenario (:mod:`.scenarios`),
writes the HTML report and returns a :class:`DemoResult`. Progress goes to
an optional callback (the CLI prints it); nothing here prints.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from raysleuth import runtime
from raysleuth.demo.job import Fault, GRPOTrainer, JobConfig, RolloutWorker, instrument, score_group
from raysleuth.errors import ToolMissing, UsageError

__all__ = ["DemoResult", "Job", "JobOutcome", "ScenarioResult", "connect_for_demo", "run_demo"]

Progress = Callable[[str], None]


@dataclasses.dataclass(kw_only=True)
class ScenarioResult:
    """One scenario: what was injected, what found it, what it said, and whether that was right."""

    scenario: str
    injected: str
    found_by: str
    """The raysleuth command (or API call) that diagnosed it."""
    verdict: str
    """What that command said, in one line."""
    expected: str
    correct: bool
    seconds: float = 0.0
    culprit_ranks: list[int] = dataclasses.field(default_factory=list)
    steps_run: int = 0
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    """Why the scenario could not run or be diagnosed (then ``correct`` is False)."""


@dataclasses.dataclass(kw_only=True)
class DemoResult:
    """Every scenario's result, and where the evidence and the report are."""

    results: list[ScenarioResult]
    run_id: str | None = None
    home: str | None = None
    report_path: str | None = None
    trace_path: str | None = None
    address: str | None = None
    started_here: bool = False
    seconds: float = 0.0
    report_error: str | None = None

    @property
    def ok(self) -> bool:
        """Every scenario diagnosed correctly."""
        return bool(self.results) and all(result.correct for result in self.results)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``ok`` included)."""
        data = dataclasses.asdict(self)
        data["ok"] = self.ok
        return data


@dataclasses.dataclass(kw_only=True)
class JobOutcome:
    """How a run of the job ended."""

    steps_done: int = 0
    hung_step: int | None = None
    error: str | None = None
    """The text of the exception the job raised (a crash), if any."""
    error_object: BaseException | None = None
    seconds: float = 0.0


def connect_for_demo(address: str | None = None, *, num_cpus: int = 8):
    """The demo's Ray: the one this process is connected to, else ``address``, else a fresh local one.

    Returns ``(ClusterInfo, started_here)``. Without ``address`` the demo
    never attaches to a cluster found by ``auto`` (other jobs may run there).
    """
    import ray

    from raysleuth import cluster

    if ray.is_initialized():
        return cluster.connect(), False
    if address:
        return cluster.connect(address), False
    # Never `auto`: another job's cluster on this machine is not the demo's to use.
    info = cluster.start_local(num_cpus=num_cpus, log_to_driver=False)
    return info, True


class Job:
    """The GRPO job of one scenario: a rollout worker, the reward/reference task, trainer ranks."""

    def __init__(self, scenario: str, config: JobConfig, fault: Fault, *, ready_timeout: float = 120.0) -> None:
        import ray

        config = dataclasses.replace(config, name=scenario)
        self.scenario, self.config, self.fault = scenario, config, fault
        suffix = f"{os.getpid()}-{int(time.time() * 1000) % 10**8}"
        rollout_class = ray.remote(num_cpus=1)(RolloutWorker)
        trainer_class = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(GRPOTrainer)
        self.score = ray.remote(num_cpus=1, max_retries=0)(score_group)
        self.rollout = rollout_class.options(name=f"demo-{scenario}-rollout-{suffix}").remote(config.seed)
        self.trainers = [
            trainer_class.options(name=f"demo-{scenario}-{suffix}-trainer_rank{rank}").remote(
                rank, config.world_size, config, fault)
            for rank in range(config.world_size)
        ]
        self.pids = {info["rank"]: info["pid"] for info in
                     ray.get([trainer.ready.remote() for trainer in self.trainers], timeout=ready_timeout)}
        self.reference_weights = ray.put(ray.get(self.trainers[0].weights.remote(), timeout=ready_timeout))
        self.extra_actors: list = []

    def run(self, steps: int, *, first_step_timeout: float = 120.0, step_timeout: float = 15.0,
            min_seconds: float = 0.0, max_steps: int | None = None) -> JobOutcome:
        """Train ``steps`` steps; stops at the first step that does not finish in time, or that raises.

        ``min_seconds``: keep training past ``steps`` (up to ``max_steps``) until
        this long has passed since step 1 (a fast machine still gives the memory
        sampler enough samples).
        """
        import itertools

        import ray

        started = time.monotonic()
        outcome = JobOutcome()
        weights = None
        training_started = None
        for step in itertools.count():
            if step >= steps and (training_started is None or time.monotonic() - training_started >= min_seconds
                                  or step >= (max_steps or steps)):
                break
            if step == 1:
                training_started = time.monotonic()
            batch = self.rollout.generate.remote(step, weights, self.config.prompts, self.config.group)
            scored = self.score.remote(batch, self.reference_weights, self.config.seed)
            grad_refs = [trainer.compute_grads.remote(step, scored) for trainer in self.trainers]
            # Nested refs are not resolved by Ray: each rank fetches every rank's gradients itself.
            updates = [trainer.update.remote(step, grad_refs) for trainer in self.trainers]
            timeout = first_step_timeout if step == 0 else step_timeout
            deadline = time.monotonic() + timeout
            waiting, failed = list(updates), None
            while waiting and failed is None:  # stop at the first rank that raises, like a real job
                ready, waiting = ray.wait(waiting, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    break
                failed = _first_error(ready)
            if failed is not None:
                outcome.error, outcome.error_object = f"{type(failed).__name__}: {failed}", failed
                break
            if waiting:
                outcome.hung_step = step
                break
            outcome.steps_done = step + 1
            weights = self.trainers[0].weights.remote()
        outcome.seconds = time.monotonic() - started
        return outcome

    def actor_ids(self) -> set[str]:
        """The ids of the job's actors (to pick its own entries out of cluster-wide listings)."""
        ids = set()
        for actor in [self.rollout, *self.trainers, *self.extra_actors]:
            try:
                ids.add(actor._actor_id.hex())
            except Exception:
                pass
        return ids

    def call_all(self, method: str, *args: Any, timeout: float = 30.0) -> list[Any]:
        """Call a method on every trainer rank and wait (for finishing touches)."""
        import ray

        return ray.get([getattr(trainer, method).remote(*args) for trainer in self.trainers], timeout=timeout)

    def flush(self) -> None:
        """Ask every healthy rank to flush its evidence (bounded; a hung rank is skipped)."""
        import ray

        refs = [trainer.stop.remote() for trainer in self.trainers]
        ray.wait(refs, num_returns=len(refs), timeout=10)

    def kill(self) -> None:
        """Kill every actor of the job (a hung one too: never wait on it)."""
        import ray

        for actor in [self.rollout, *self.trainers, *self.extra_actors]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass


def _first_error(refs: list) -> BaseException | None:
    import ray

    for ref in refs:
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.GetTimeoutError:
            continue
        except Exception as error:
            return error
    return None


def flush_evidence(timeout: float = 10.0) -> None:
    """Deliver this process's queued evidence (the driver's records)."""
    recorder = instrument("recorder")
    if recorder is not None:
        try:
            recorder.get_client().flush(timeout)
        except Exception:
            pass


def run_demo(
    scenarios: Iterable[str] | None = None,
    *,
    address: str | None = None,
    report_path: Path | str | None = None,
    config: JobConfig | None = None,
    progress: Progress | None = None,
    write_report: bool = True,
) -> DemoResult:
    """Run the scenarios (default: all), diagnose each, write the report; see :class:`DemoResult`."""
    from raysleuth.demo import scenarios as catalogue

    names = list(scenarios or catalogue.SCENARIOS)
    unknown = [name for name in names if name not in catalogue.SCENARIOS]
    if unknown:
        raise UsageError(f"unknown scenario(s) {', '.join(unknown)}",
                         fix=f"pick from {', '.join(catalogue.SCENARIOS)}")
    try:
        import torch  # noqa: F401  (the job is a torch job)
    except ImportError:
        raise ToolMissing("the demo trains a torch policy and torch is not installed",
                          fix="pip install 'raysleuth[torch]' (CPU torch is enough)") from None
    say = progress or (lambda message: None)
    config = config or JobConfig()
    started = time.monotonic()
    say("connecting to Ray" if address else "starting Ray (or reusing this process's connection)")
    info, started_here = connect_for_demo(address)
    from raysleuth.recorder import get_writer

    writer = get_writer()
    import ray

    writer_info = ray.get(writer.info.remote(), timeout=60)
    say(f"Ray {info.ray_version} at {info.address}; run {info.session_name}; evidence in {writer_info['path']}")
    result = DemoResult(results=[], run_id=info.session_name, home=str(runtime.settings().home),
                        address=info.address, started_here=started_here)
    for name in names:
        say(f"scenario {name}: {catalogue.INJECTED[name]}")
        scenario_started = time.monotonic()
        try:
            outcome = catalogue.RUNNERS[name](config, say)
        except Exception as error:  # a scenario that cannot run is reported, not raised
            outcome = ScenarioResult(scenario=name, injected=catalogue.INJECTED[name], found_by="-",
                                     verdict=f"scenario failed to run: {type(error).__name__}: {error}",
                                     expected=catalogue.EXPECTED[name], correct=False,
                                     error=f"{type(error).__name__}: {error}")
        outcome.seconds = round(time.monotonic() - scenario_started, 2)
        result.results.append(outcome)
        say(f"scenario {name}: {'correct' if outcome.correct else 'WRONG'} — {outcome.verdict}")
    flush_evidence()
    if write_report:
        say("writing the report")
        _write_report(result, writer_info, report_path)
    result.seconds = round(time.monotonic() - started, 2)
    return result


def _write_report(result: DemoResult, writer_info: dict[str, Any], report_path: Path | str | None) -> None:
    import ray

    store_path = Path(writer_info["path"])
    output = Path(report_path) if report_path else store_path.parent / "report.html"
    # Give the writer a moment to commit what the workers flushed last.
    try:
        ray.get(ray.get_actor("raysleuth-writer", namespace="raysleuth").info.remote(), timeout=10)
    except Exception:
        pass
    timeline = instrument("timeline")
    trace = output.parent / "trace.json"
    if timeline is not None and hasattr(timeline, "export_timeline"):
        try:
            timeline.export_timeline(trace, run=str(store_path)) if _accepts(timeline.export_timeline, "run") \
                else timeline.export_timeline(trace)
            result.trace_path = str(trace)
        except Exception as error:
            result.report_error = f"timeline export failed: {type(error).__name__}: {error}"
    try:
        from raysleuth.report import generate_report

        report = generate_report(output, run=str(store_path), trace_path=trace if trace.is_file() else None)
        result.report_path = str(report.path)
    except Exception as error:
        result.report_error = f"report failed: {type(error).__name__}: {error}"


def _accepts(function: Callable, name: str) -> bool:
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())
