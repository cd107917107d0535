"""Every renderer prints foreign text verbatim: gloo's bracketed paths and rich markup never crash or vanish.

``raysleuth tasks`` once died with rich's MarkupError on gloo's
``[/__w/pytorch/.../pair.cc:537]`` (issue 29). Each renderer here gets text
full of brackets in every field that comes from the job or Ray, and must
print it as it is.
"""

from __future__ import annotations

import pytest

from raysleuth.cli import _app

GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Connection closed by peer "
        "[127.0.0.1]:29500 [bold]x[/bold] [/] [link=file:///etc]y[/link]")


@pytest.fixture
def captured(monkeypatch):
    from rich.console import Console

    monkeypatch.setattr(_app._Console, "print", Console.print)  # no safety net: each renderer must escape itself
    _app.console.begin_capture()
    yield _app.console
    if _app.console._buffer_index:  # noqa: SLF001 (a failed test left the capture open)
        _app.console.end_capture()


def _text(console) -> str:
    return console.end_capture()


def test_tasks_renderer(captured):
    from raysleuth.cli.tasks import render_tasks
    from raysleuth.tasks.model import DeadActor, FailedTask, PendingTask, StuckTask, TaskReport  # DeadActor: a Death

    frame = {"function": GLOO, "file": "/x/pair.py", "short_file": "pair.py", "line": 3}
    report = TaskReport(
        pending=[PendingTask(task_id="a" * 48, name=GLOO, state="PENDING", reason="unknown", detail=GLOO)],
        stuck=[StuckTask(task_id="b" * 48, name=GLOO, state="RUNNING", running_s=100, peer_median_s=1, peers=3,
                         ratio=100, pid=42, stack={"pid": 42, "threads": [{"name": GLOO, "idle": True,
                                                                           "frames": [frame]}]})],
        failed=[FailedTask(task_id="c" * 48, name=GLOO, error_type="RuntimeError", error_message=GLOO, cause=GLOO,
                           fix=GLOO)],
        deaths=[DeadActor(actor_id="d" * 32, actor_class=GLOO, actor_name=GLOO, rank=2, cause="unknown",
                          summary=GLOO, evidence=[GLOO], ray_reason=GLOO, fix=GLOO)],
        warnings=[GLOO])
    render_tasks(report)
    output = _text(captured)
    assert output.count(GLOO) >= 10, output
    assert "stack of pid 42" in output and f"{GLOO} (pair.py:3)" in output and '"threads"' not in output


def test_deaths_renderer(captured):
    from raysleuth.cli.tasks import print_deaths
    from raysleuth.deaths import Death

    death = Death(cause="sigkill", summary=GLOO, evidence=[GLOO], rank=2, actor_class=GLOO, task=GLOO,
                  last_stderr=[GLOO], fix=GLOO, stack=[{"function": GLOO, "file": "a/b.py", "line": 1}])
    print_deaths([death])
    assert _text(captured).count(GLOO) >= 5


def test_crash_renderers(captured):
    from raysleuth.cli.crashes import render_capsule, render_crashes
    from raysleuth.evidence import Crash
    from raysleuth.postmortem.query import CrashSummary
    from raysleuth.recorder.store import Record

    render_crashes([CrashSummary(id=1, time=0.0, rank=1, node_ip=GLOO, hostname=None, pid=1, actor=None,
                                 method=GLOO, exception_type="RuntimeError", message=GLOO[:57], cause=GLOO)])
    render_capsule(Crash.from_record(Record(id=1, kind="crash", time=0.0, data={
        "exception_type": GLOO, "message": GLOO, "node_ip": GLOO, "traceback": GLOO, "errors": [GLOO],
        "chain": [{"relation": "cause", "type": GLOO, "message": GLOO}, {"relation": "raised", "type": "E",
                                                                           "message": GLOO}],
        "explanations": [{"title": GLOO, "cause": GLOO, "fix": GLOO}],
        "frames": [{"file": GLOO, "line": 1, "function": GLOO, "code": GLOO, "locals": {"x": GLOO}}]})))
    output = _text(captured)
    assert GLOO[:57] in output and output.count(GLOO) >= 10, output


def test_collectives_renderer(captured):
    from raysleuth.cli.collectives import render_collectives
    from raysleuth.collectives.model import CollectiveVerdict, Finding, GroupAlignment
    from raysleuth.collectives.report import CollectivesReport

    cell = {"call": GLOO, "where": GLOO, "state": "pending"}
    group = GroupAlignment(name="0", desc=GLOO, ranks=[0, 1], rows=[{"seq": 1, "ranks": {0: cell, 1: cell}}],
                           findings=[], last={0: 1, 1: 1})
    verdict = CollectiveVerdict(groups=[group], culprits=[Finding(rank=1, kind="dead", group="0", seq=1,
                                                                  reason=GLOO)], summary=GLOO)
    render_collectives(CollectivesReport(run=None, job_id=None, live=False, requested=False, answered=[],
                                         ranks=[], verdict=verdict, notes=[GLOO]))
    assert _text(captured).count(GLOO) >= 5


def test_log_memory_explain_doctor_timeline_demo_renderers(captured):
    from raysleuth.cli.demo import render_demo
    from raysleuth.cli.doctor import render_doctor
    from raysleuth.cli.explain import render_matches
    from raysleuth.cli.logs import _print_line
    from raysleuth.cli.memory import _print_report
    from raysleuth.cli.timeline import render_summary
    from raysleuth.demo.harness import ScenarioResult
    from raysleuth.demo.runner import DemoResult
    from raysleuth.doctor.checks import Check
    from raysleuth.doctor.report import DoctorReport
    from raysleuth.explain import explain
    from raysleuth.logs.query import LogLine
    from raysleuth.memory.workers import MemoryReport, WorkerMemory
    from raysleuth.timeline import StepPhase

    _print_line(LogLine(id=1, time=0.0, level="ERROR", name=GLOO, message=GLOO, rank=1, world_size=2, step=1,
                        phase=None, node_ip=None, node_id=None, hostname=None, pid=1, actor_id=None,
                        actor_name=None, actor_class=None, exc_text=GLOO))
    _print_report(MemoryReport(store="s", workers=[WorkerMemory(rank=None, pid=1, node_ip=GLOO, actor_class=GLOO,
                                                                reason=GLOO)]), [GLOO])
    render_matches(explain(f"RuntimeError: {GLOO}") or [])
    render_doctor(DoctorReport(checks=[Check(name=GLOO, status="fail", detail=GLOO, fix=GLOO, node=GLOO)]))
    render_summary([StepPhase(step=1, phase=GLOO, durations={GLOO: 1.0}, median_s=1.0, slowest=GLOO,
                              slowest_s=1.0, lag_s=0.0, lag_ratio=1.0)])
    render_demo(DemoResult(results=[ScenarioResult(scenario=GLOO, injected=GLOO, found_by=GLOO, verdict=GLOO,
                                                   expected="", correct=True)]))
    output = _text(captured)
    assert output.count(GLOO) >= 15, output


def test_safety_net_prints_plain_instead_of_crashing():
    with_net = _app._Console(highlight=False, width=200)
    with_net.begin_capture()
    with_net.print(f"[red]{GLOO}")  # an unescaped renderer: plain text, no MarkupError
    assert GLOO in with_net.end_capture()
