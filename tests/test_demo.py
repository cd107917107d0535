"""``raysleuth demo``: all six scenarios (healthy, hang, diverge, leak, crash, pending) on the session's real cluster.

The demo runs in this process against the already-connected ``ray_cluster``
(``run_demo`` reuses a connected Ray), with a shorter job than the CLI's to
keep the suite fast. Each scenario must be diagnosed correctly, by the real
features: ``dump_stacks`` names the hung rank, the consistency checks name
the diverged rank and its tensors, and the healthy job has nothing flagged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raysleuth.cli import main
from raysleuth.demo import SCENARIOS, run_demo
from raysleuth.demo.job import JobConfig
from raysleuth.errors import UsageError


@pytest.fixture(scope="module")
def demo_result(ray_cluster, tmp_path_factory):
    messages: list[str] = []
    report = tmp_path_factory.mktemp("demo") / "report.html"
    result = run_demo(list(SCENARIOS), config=JobConfig(steps=6), report_path=report,
                      progress=messages.append)
    return result, messages


def test_every_scenario_is_diagnosed_correctly(demo_result) -> None:
    result, messages = demo_result
    table = {item.scenario: item for item in result.results}
    assert list(table) == ["healthy", "hang", "diverge", "leak", "crash", "pending"]
    for item in result.results:
        assert item.correct, f"{item.scenario}: {item.verdict} ({item.error}; {item.details})"
    assert result.ok
    assert not result.started_here  # it reused the session's cluster
    assert any("scenario hang" in message for message in messages)


def test_healthy_flags_nothing(demo_result) -> None:
    healthy = demo_result[0].results[0]
    assert healthy.steps_run == 6
    assert healthy.verdict.startswith("nothing flagged")
    assert healthy.culprit_ranks == []


def test_hang_names_rank_1(demo_result) -> None:
    hang = demo_result[0].results[1]
    assert hang.culprit_ranks == [1]
    assert hang.steps_run == 2  # it hung at step 2
    assert hang.found_by.startswith("raysleuth stacks")


def test_diverge_names_rank_2_and_tensors(demo_result) -> None:
    diverge = demo_result[0].results[2]
    assert diverge.culprit_ranks == [2]
    assert "tensors differ" in diverge.verdict and "weight" in diverge.verdict
    assert diverge.details["in_rank_outliers"] in ([], [2])


def test_leak_names_rank_1_only(demo_result) -> None:
    leak = demo_result[0].results[3]
    assert leak.scenario == "leak" and leak.culprit_ranks == [1], leak.verdict


def test_crash_capsule_from_rank_1_is_explained(demo_result) -> None:
    crash = demo_result[0].results[4]
    assert crash.scenario == "crash" and crash.culprit_ranks == [1], crash.verdict
    assert "explain:" in crash.verdict


def test_pending_gpu_worker_is_infeasible(demo_result) -> None:
    pending = demo_result[0].results[5]
    assert pending.scenario == "pending" and pending.correct, pending.verdict
    assert "GPU" in pending.verdict or "gpu" in pending.verdict.lower(), pending.verdict


def test_demo_writes_the_report(demo_result) -> None:
    result = demo_result[0]
    assert result.report_error is None or "timeline" in result.report_error, result.report_error
    text = Path(result.report_path).read_text()
    assert "Stacks and verdicts" in text and "MISMATCH" in text


def test_unknown_scenario_is_a_usage_error(ray_cluster) -> None:
    with pytest.raises(UsageError):
        run_demo(["nope"])
    assert main(["demo", "--scenario", "nope"]) == 2
    assert set(SCENARIOS) == {"healthy", "hang", "diverge", "leak", "crash", "pending"}
