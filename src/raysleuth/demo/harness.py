"""The harness that runs the demo's job for one scenario: start its actors, train, stop, kill.

:class:`Job` is what a user's driver would be: it creates the rollout
worker, the reward task and the trainer ranks, and drives GRPO steps with
``ray.wait`` so that a hung or failing rank ends the run instead of the demo.
:class:`ScenarioResult` is what each scenario returns.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import raysleuth as rs
from raysleuth.demo.job import Fault, GRPOTrainer, JobConfig, RolloutWorker, score_group
from raysleuth.ray_private import actor_id_hex

__all__ = ["Job", "JobOutcome", "ScenarioResult", "flush_evidence"]


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
class JobOutcome:
    """How a run of the job ended."""

    steps_done: int = 0
    hung_step: int | None = None
    error: str | None = None
    """The text of the exception the job raised (a crash), if any."""
    error_object: BaseException | None = None
    seconds: float = 0.0


#: The scenarios whose trainers check their weights across ranks: the divergence and its healthy twin. The
#: others leave no consistency rows in the run (its report's consistency section shows what the fault is about).
CONSISTENCY_SCENARIOS = ("healthy", "diverge")


class Job:
    """The GRPO job of one scenario: a rollout worker, the reward/reference task, trainer ranks."""

    def __init__(self, scenario: str, config: JobConfig, fault: Fault, *, ready_timeout: float = 120.0) -> None:
        import ray

        config = dataclasses.replace(config, name=scenario, consistency_every=(
            config.consistency_every if scenario in CONSISTENCY_SCENARIOS else 0))
        self.scenario, self.config, self.fault = scenario, config, fault
        suffix = f"{os.getpid()}-{int(time.time() * 1000) % 10**8}"
        rollout_class = ray.remote(num_cpus=1)(RolloutWorker)
        trainer_class = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(GRPOTrainer)
        # Any: Ray's handle types give actor methods no .remote()
        self.score: Any = ray.remote(num_cpus=1, max_retries=0)(score_group)
        self.rollout: Any = rollout_class.options(name=f"demo-{scenario}-rollout-{suffix}").remote(config.seed)
        self.trainers: list[Any] = [
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
                ids.add(actor_id_hex(actor))
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
    rs.flush(timeout)
