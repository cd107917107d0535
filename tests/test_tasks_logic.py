"""Pure logic of task forensics and the timeline, without Ray."""

from __future__ import annotations

import pytest

from raysleuth.errors import UsageError
from raysleuth.cluster.records import RayTaskEvent
from raysleuth.tasks.classify import death_cause, fit_problem, is_stuck, pg_problem, robust_stats, upstream_task_id
from raysleuth.tasks.lifecycle import phases_from_events, task_id_of
from raysleuth.timeline import parse_ranks, parse_steps, summarize_steps

NODES = [{"CPU": 8.0, "memory": 1e9}, {"CPU": 4.0, "GPU": 1.0}]


def test_fit_problem_names_resource_and_largest_capacity():
    assert fit_problem({"CPU": 2}, NODES) is None
    assert fit_problem({"CPU": 4, "GPU": 1}, NODES) is None
    assert fit_problem({"GPU": 2}, NODES) == "needs GPU: 2, the largest node has GPU: 1"
    assert fit_problem({"TPU": 1}, NODES) == "needs TPU: 1, but no node has any TPU"
    assert "no single node" in fit_problem({"CPU": 8, "GPU": 1}, NODES)
    assert fit_problem({}, NODES) is None


def test_pg_problem_by_strategy():
    assert pg_problem([{"CPU": 4}, {"CPU": 4}], "PACK", NODES) is None
    assert "STRICT_PACK" in pg_problem([{"CPU": 6}, {"CPU": 4}], "STRICT_PACK", NODES)
    assert "bundle 0 needs CPU: 64" in pg_problem([{"CPU": 64}], "PACK", NODES)
    assert "in all" in pg_problem([{"CPU": 8}, {"CPU": 8}], "SPREAD", NODES)
    assert "STRICT_SPREAD" in pg_problem([{"CPU": 1}] * 3, "STRICT_SPREAD", NODES)


def test_stuck_needs_peers_floor_and_factor():
    peers = [1.0, 1.1, 0.9, 1.0]
    assert is_stuck(20.0, peers)[0]
    assert not is_stuck(4.0, peers)[0]  # under 5x
    assert not is_stuck(20.0, peers[:2])[0]  # too few peers
    assert not is_stuck(8.0, [0.1, 0.1, 0.1], floor_s=10.0)[0]  # under the floor
    assert not is_stuck(60.0, [1, 50, 100, 2, 80])[0]  # noisy peers: within their spread
    assert robust_stats([1, 2, 3])[0] == 2


def test_death_causes():
    def actor(reason, message=""):
        return {"death_cause": {"actor_died_error_context": {"reason": reason, "error_message": message}}}

    assert death_cause(actor("RAY_KILL"))["cause"] == "killed"
    assert death_cause(actor("OUT_OF_MEMORY"))["cause"] == "oom_killed"
    assert death_cause(actor("NODE_DIED"))["cause"] == "node_died"
    assert death_cause(actor("WORKER_DIED", "Worker exit type: SYSTEM_ERROR"))["cause"] == "worker_died"
    assert death_cause(actor("WORKER_DIED", "Worker exit type: INTENDED_USER_EXIT"))["cause"] == "exited"
    assert death_cause({"death_cause": {"creation_task_failure_context": {"error_message": "boom"}}})["cause"] == \
        "constructor_failed"
    assert death_cause({})["cause"] == "unknown"


def test_ids_and_phases():
    task = "16310a0f0a45af5cffffffffffffffffffffffff01000000"
    assert upstream_task_id(task + "01000000") == task
    assert task_id_of(task + "01000000") == task and task_id_of(task.upper()) == task
    with pytest.raises(UsageError):
        task_id_of("nope")
    phases = phases_from_events([RayTaskEvent(state="RUNNING", created_ms=2000.0),
                                 RayTaskEvent(state="PENDING_ARGS_AVAIL", created_ms=1000.0),
                                 RayTaskEvent(state="FINISHED", created_ms=5000.0)], now=10.0)
    assert [p.state for p in phases] == ["PENDING_ARGS_AVAIL", "RUNNING", "FINISHED"]
    assert [p.duration_s for p in phases] == [1.0, 3.0, 0.0]
    still = phases_from_events([RayTaskEvent(state="RUNNING", created_ms=2000.0)], now=7.0)
    assert still[0].end is None and still[0].duration_s == 5.0


def test_parse_and_summarize():
    assert parse_steps("10-20") == (10, 20) and parse_steps("7") == (7, 7) and parse_steps("10-") == (10, None)
    assert parse_ranks("0,1,4-5") == [0, 1, 4, 5]
    for bad in ("x", "9-3"):
        with pytest.raises(UsageError):
            parse_steps(bad)
    rows = summarize_steps([
        {"step": 1, "name": "fwd", "rank": 0, "duration_s": 1.0},
        {"step": 1, "name": "fwd", "rank": 1, "duration_s": 1.2},
        {"step": 1, "name": "fwd", "rank": 2, "duration_s": 4.0},
        {"step": 1, "name": "fwd", "rank": 2, "duration_s": 1.0},  # same phase twice: summed
        {"step": None, "name": "fwd", "rank": 0, "duration_s": 9.0},  # no step: left out
        {"step": 1, "name": "ray.call:f", "rank": 0, "duration_s": 9.0},  # calls in flight: left out
    ])
    assert len(rows) == 1
    row = rows[0]
    assert row.slowest == "2" and row.slowest_s == 5.0 and row.median_s == 1.2
    assert row.lag_s == pytest.approx(3.8) and row.lag_ratio == pytest.approx(5.0 / 1.2)


def test_task_id_prefix_completes_like_git():
    from raysleuth.errors import UsageError
    from raysleuth.tasks.lifecycle import complete_task_id, task_id_of

    ids = ["aa" * 24, "ab" * 24, "abab" + "cd" * 22]
    assert complete_task_id("aaaaaa", ids) == ids[0]
    assert complete_task_id(ids[1][:16], ids) == ids[1]
    with pytest.raises(UsageError, match="ambiguous: 2 tasks match"):
        complete_task_id("ababab"[:4] + "ab", ["abab" * 12, "ababab" + "00" * 21])
    with pytest.raises(UsageError, match="no task id starts with"):
        complete_task_id("ffffff", ids)
    assert task_id_of(ids[0][:16]) == ids[0][:16]
    with pytest.raises(UsageError, match="not a Ray task id"):
        task_id_of("abc")
