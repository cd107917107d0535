"""``raysleuth demo``: a real GRPO job on Ray with injected faults, each diagnosed by raysleuth.

- :mod:`raysleuth.demo.job` — the training job (policy, rollout worker, reward/reference task, trainer ranks).
- :mod:`raysleuth.demo.harness` — :class:`~raysleuth.demo.harness.Job`, which drives the job for one scenario.
- :mod:`raysleuth.demo.scenarios` — the faults and their diagnoses, through the public ``rs.*`` API.
- :mod:`raysleuth.demo.runner` — :func:`run_demo`: connect, run the scenarios, write the report.

Nothing here prints: progress goes to a callback; the CLI renders results.
"""

from __future__ import annotations

from raysleuth.demo.harness import ScenarioResult
from raysleuth.demo.runner import DemoResult, run_demo
from raysleuth.demo.scenarios import EXPECTED, FOUND_BY, INJECTED, SCENARIOS

__all__ = ["DemoResult", "EXPECTED", "FOUND_BY", "INJECTED", "SCENARIOS", "ScenarioResult", "run_demo"]
