"""``raysleuth demo``: a real GRPO job on Ray with injected faults, each diagnosed by raysleuth.

- :mod:`raysleuth.demo.job` — the training job (policy, rollout worker, reward/reference task, trainer ranks).
- :mod:`raysleuth.demo.runner` — :func:`run_demo`, the job harness and the result dataclasses.
- :mod:`raysleuth.demo.scenarios` — the faults and their diagnoses.

Nothing here prints: progress goes to a callback; the CLI renders results.
"""

from __future__ import annotations

from raysleuth.demo.runner import DemoResult, ScenarioResult, run_demo
from raysleuth.demo.scenarios import EXPECTED, FOUND_BY, INJECTED, SCENARIOS

__all__ = ["DemoResult", "EXPECTED", "FOUND_BY", "INJECTED", "SCENARIOS", "ScenarioResult", "run_demo"]
