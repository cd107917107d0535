"""Task forensics on the real 2-node cluster: pending reasons, stuck calls, failures, dead actors, lifecycles."""

from __future__ import annotations

import json
import os
import signal

import pytest
import ray

from raysleuth.cli import main
from raysleuth.tasks import find_tasks, trace_ray_task
from polling import poll
from victims.task_forensics import GLOO_PEER_CLOSED, Worker, downstream, fails, fails_like_gloo, needs_gpu, never_finishes

TIMEOUT = 60.0


def test_infeasible_task_and_placement_group_name_the_resource(ray_cluster):
    ref = needs_gpu.remote()
    group = ray.util.placement_group([{"CPU": 64}], strategy="STRICT_PACK", name="forensics_big_pg")
    task_id = ref.task_id().hex()
    try:
        def found():
            report = find_tasks(ray_cluster.address, stuck=False, failed=False, dead=False)
            by_id = {item.task_id: item for item in report.pending}
            pg = next((item for item in report.pending if item.name == "forensics_big_pg"), None)
            return (by_id.get(task_id), pg, report) if task_id in by_id and pg else None

        task, pg, report = poll(found, timeout=TIMEOUT)
        assert task.reason == "infeasible"
        assert "GPU" in task.detail and "no node has any GPU" in task.detail
        assert task.problem
        assert pg.reason == "infeasible" and pg.type == "PLACEMENT_GROUP"
        assert "CPU: 64" in pg.detail and "CPU: 8" in pg.detail  # the largest node's capacity
        assert report.problem and report.truncated is False
    finally:
        ray.cancel(ref, force=True)
        ray.util.remove_placement_group(group)


def test_task_waiting_on_upstream_names_it(ray_cluster):
    upstream = never_finishes.remote(600)
    waiting = downstream.remote(upstream)
    try:
        def found():
            report = find_tasks(ray_cluster.address, stuck=False, failed=False, dead=False)
            item = next((p for p in report.pending if p.task_id == waiting.task_id().hex()), None)
            # the upstream is named from the moment it is submitted; wait until it runs
            return item if item and item.upstream and item.upstream[0]["state"] == "RUNNING" else None

        item = poll(found, timeout=TIMEOUT)
        assert item is not None, "the downstream task never showed as waiting with its upstream"
        assert item.reason == "waiting_for_dependencies"
        assert item.upstream[0]["task_id"] == upstream.task_id().hex()
        assert "never_finishes" in item.detail and "RUNNING" in item.detail
    finally:
        ray.cancel(waiting, force=True)
        ray.cancel(upstream, force=True)


def test_slow_actor_call_is_stuck_with_rank_and_trace(ray_cluster):
    actor = Worker.options(name="forensics_rank7").remote()
    try:
        ray.get([actor.work.remote(0.1) for _ in range(6)], timeout=TIMEOUT)
        slow = actor.work.remote(120)  # far beyond 20x its peers
        slow_id = slow.task_id().hex()

        def found():
            report = find_tasks(ray_cluster.address, pending=False, failed=False, dead=False, stuck_floor_s=2.0)
            return next((item for item in report.stuck if item.task_id == slow_id), None)

        item = poll(found, timeout=TIMEOUT)
        assert item is not None, "the slow call was not reported stuck"
        assert item.rank == 7 and item.pid == ray.get(actor.pid.remote(), timeout=TIMEOUT)
        assert item.ratio > 5 and item.peers >= 3 and item.peer_median_s < 1.0

        lifecycle = trace_ray_task(slow, ray_cluster.address)
        assert lifecycle.state == "RUNNING" and lifecycle.type == "ACTOR_TASK"
        states = [phase.state for phase in lifecycle.attempts[-1].phases]
        assert "RUNNING" in states and lifecycle.running_s > 1.0
        assert lifecycle.attempts[-1].phases[-1].end is None  # still running
    finally:
        ray.kill(actor)


def test_dead_actors_have_rank_and_cause(ray_cluster):
    killed = Worker.options(name="forensics_killed_rank2").remote()
    crashed = Worker.options(name="forensics_crashed").remote(rank=5)
    ray.get(killed.pid.remote(), timeout=TIMEOUT)
    crashed_pid = ray.get(crashed.pid.remote(), timeout=TIMEOUT)
    assert ray.get(crashed.flush.remote(), timeout=TIMEOUT)  # registers its rank with the writer
    ray.kill(killed)
    os.kill(crashed_pid, signal.SIGKILL)

    def found():
        report = find_tasks(ray_cluster.address, pending=False, stuck=False, failed=False)
        by_name = {item.actor_name: item for item in report.dead_actors}
        if "forensics_killed_rank2" in by_name and "forensics_crashed" in by_name:
            return by_name
        return None

    by_name = poll(found, timeout=TIMEOUT)
    assert by_name, "both dead actors should be listed"
    killed_entry, crashed_entry = by_name["forensics_killed_rank2"], by_name["forensics_crashed"]
    assert killed_entry.cause == "ray_kill" and killed_entry.ray_reason == "RAY_KILL" and killed_entry.rank == 2
    assert crashed_entry.cause == "sigkill" and crashed_entry.ray_reason == "WORKER_DIED"
    assert crashed_entry.pid == crashed_pid
    assert crashed_entry.rank == 5  # from what its instruments registered, not its name


def test_failed_task_and_cli_json(ray_cluster, capsys):
    ref = fails.remote()
    with pytest.raises(ray.exceptions.RayTaskError):
        ray.get(ref, timeout=TIMEOUT)
    task_id = ref.task_id().hex()

    def found():
        report = find_tasks(ray_cluster.address, pending=False, stuck=False, dead=False)
        return next((item for item in report.failed if item.task_id == task_id), None)

    item = poll(found, timeout=TIMEOUT)
    assert item is not None and item.error_type == "TASK_EXECUTION_EXCEPTION"
    assert "victim task failed on purpose" in item.error_message

    capsys.readouterr()
    code = main(["tasks", "--failed", "--json", "--address", ray_cluster.address])
    payload = json.loads(capsys.readouterr().out)
    assert code == 1  # something failed
    assert set(payload) >= {"pending", "stuck", "failed", "dead_actors", "truncated"}
    assert any(entry["task_id"] == task_id for entry in payload["failed"])

    code = main(["trace", task_id, "--json", "--address", ray_cluster.address])
    lifecycle = json.loads(capsys.readouterr().out)
    assert code == 1 and lifecycle["state"] == "FAILED"
    states = [phase["state"] for phase in lifecycle["attempts"][-1]["phases"]]
    # the worker's RUNNING event may arrive after the owner's FAILED: only the order is certain
    assert states[-1] == "FAILED" and len(states) >= 2
    assert all(phase["duration_s"] >= 0 for phase in lifecycle["attempts"][-1]["phases"])

    code = main(["trace", "not-a-task", "--address", ray_cluster.address])
    assert code == 2

    # The 16 characters `raysleuth tasks` prints are enough (a unique prefix, as git takes).
    code = main(["trace", task_id[:16], "--json", "--address", ray_cluster.address])
    short = json.loads(capsys.readouterr().out)
    assert code == 1 and short["task_id"] == task_id and short["state"] == "FAILED"
    code = main(["trace", "0123456789abcdef0123", "--address", ray_cluster.address, "--wait", "0"])
    assert code == 2 and "no task id starts with '0123456789abcdef0123'" in " ".join(capsys.readouterr().err.split())


def test_failed_task_with_gloo_text_is_drawn(ray_cluster, capsys):
    """gloo's '[/__w/.../pair.cc:537]' once crashed `raysleuth tasks` with rich's MarkupError."""
    ref = fails_like_gloo.remote()
    with pytest.raises(ray.exceptions.RayTaskError):
        ray.get(ref, timeout=TIMEOUT)
    task_id = ref.task_id().hex()
    poll(lambda: any(item.task_id == task_id for item in find_tasks(
        ray_cluster.address, pending=False, stuck=False, dead=False).failed), timeout=TIMEOUT)
    capsys.readouterr()
    code = main(["tasks", "--failed", "--address", ray_cluster.address])
    out = capsys.readouterr().out
    assert code == 1, out
    row = next(line for line in out.splitlines() if task_id[:16] in line)
    assert GLOO_PEER_CLOSED in row and "fails_like_gloo" in row, out  # one record per line, text verbatim


def test_a_prefix_is_completed_past_a_listing_cut_at_its_limit(ray_cluster, monkeypatch):
    """On a busy cluster (the test suite's own, late in the run) the task listing stops at the State API's
    limit before it reaches every task; the failed task a prefix names is then found in the listing of
    unfinished and failed tasks, which the GCS filters before that limit. The cut is made certain here: the
    real listing, marked cut, without the task."""
    from raysleuth.cluster.state import Listing
    from raysleuth.tasks import lifecycle

    ref = fails.remote()
    with pytest.raises(ray.exceptions.RayTaskError):
        ray.get(ref, timeout=TIMEOUT)
    task_id = ref.task_id().hex()
    poll(lambda: trace_ray_task(task_id, ray_cluster.address), timeout=TIMEOUT)  # its events have arrived
    original, asked = lifecycle.cluster.tasks, []

    def cut(**kwargs):
        asked.append(kwargs.get("not_states", ()))
        listing = original(**kwargs)
        if kwargs.get("not_states"):
            return listing
        return Listing(items=[t for t in listing if not t.task_id.startswith(task_id[:16])], truncated=True)

    monkeypatch.setattr(lifecycle.cluster, "tasks", cut)
    assert lifecycle._full_task_id(task_id[:16], deadline=0.0) == task_id
    assert ("FINISHED",) in asked  # completed through the filtered listing
