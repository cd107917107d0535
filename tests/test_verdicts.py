"""The verdict on real jobs of the shapes users run (tests/victims/verdict_shapes.py, no raysleuth inside).

Each shape runs once here; bench/bench_verdicts.py runs each many times and counts false alarms. Each test
asserts the state, the root cause (or the cycle's members) and the exit code, and the healthy twins must
stay quiet: exit 0 only with progress seen.
"""

from __future__ import annotations

import json
import time

import pytest

from raysleuth.cli import main
from victim_process import Victim

SHAPES = "victims.verdict_shapes"


def stacks(address: str, victim: Victim, capsys) -> tuple[int, dict]:
    args = ["stacks", "--address", address, "--json", "--no-record", "--timeout", "60", "--job", victim.job_id]
    capsys.readouterr()
    code = main(args)
    out = capsys.readouterr().out
    return code, json.loads(out)


def settle(address: str, victim: Victim, capsys, done, timeout: float = 90.0) -> tuple[int, dict]:
    """The verdict once ``done(code, data)`` holds (a shape takes a moment to settle), or the last one."""
    deadline = time.monotonic() + timeout
    code, data = stacks(address, victim, capsys)
    while not done(code, data) and time.monotonic() < deadline:
        time.sleep(1)
        code, data = stacks(address, victim, capsys)
    return code, data


@pytest.fixture
def shape(ray_cluster):
    started: list[Victim] = []

    def start(name: str, *args: str) -> Victim:
        victim = Victim(ray_cluster.address, name, *args, module=SHAPES).ready()
        started.append(victim)
        return victim

    yield start
    for victim in started:
        victim.stop()


def _verdict(data: dict) -> dict:
    return data["verdict"]


def test_stuck_async_engine_names_the_coroutine_under_the_setup_hook(ray_cluster, shape, capsys):
    victim = shape("async_stuck", "--hook")
    code, data = settle(ray_cluster.address, victim, capsys, lambda c, d: _verdict(d)["state"] == "culprit")
    verdict = _verdict(data)
    assert code == 1 and verdict["state"] == "culprit", verdict
    [culprit] = verdict["culprits"]
    assert culprit["rule"] == "coroutine" and culprit["function"].endswith("generate"), culprit
    assert "Event" in culprit["reason"] and culprit["file"].endswith("verdict_shapes.py"), culprit
    # the driver waiting on the requests is a consequence, tied by its ray.get
    assert any("ray.get" in item["because"] for item in verdict["consequences"]), verdict["consequences"]


def test_stuck_async_engine_without_raysleuth_is_hung_and_says_the_coroutines_are_invisible(ray_cluster, shape,
                                                                                             capsys):
    victim = shape("async_stuck")
    code, data = settle(ray_cluster.address, victim, capsys, lambda c, d: _verdict(d)["state"] == "hung")
    verdict = _verdict(data)
    assert code == 1 and verdict["state"] == "hung" and verdict["culprits"] == [], verdict
    assert any("coroutines are invisible" in note for note in verdict["notes"]), verdict["notes"]


def test_healthy_async_engine_is_busy(ray_cluster, shape, capsys):
    victim = shape("async_healthy")
    for _ in range(1):  # (bench/bench_verdicts.py repeats it)
        code, data = stacks(ray_cluster.address, victim, capsys)
        assert (code, _verdict(data)["state"]) == (0, "busy"), _verdict(data)


def test_two_actors_waiting_on_each_other_are_a_deadlock(ray_cluster, shape, capsys):
    victim = shape("cycle")
    code, data = settle(ray_cluster.address, victim, capsys, lambda c, d: _verdict(d)["state"] == "deadlock")
    verdict = _verdict(data)
    assert code == 1 and verdict["state"] == "deadlock", verdict
    assert sorted(c["actor_class"] for c in verdict["culprits"]) == ["Learner", "ParamServer"]
    assert any(edge["kind"] == "queued call" for edge in verdict["edges"]), verdict["edges"]
    assert any("ray.get" in item["because"] for item in verdict["consequences"])  # the driver


@pytest.mark.parametrize("hook", [False, True], ids=["outside", "setup-hook"])
def test_healthy_ddp_loop_that_sleeps_between_steps_is_busy(ray_cluster, shape, capsys, hook):
    victim = shape("ddp_sleep", *(["--hook"] if hook else []))
    for _ in range(1):  # (bench/bench_verdicts.py repeats it)
        code, data = stacks(ray_cluster.address, victim, capsys)
        assert (code, _verdict(data)["state"], _verdict(data)["culprits"]) == (0, "busy", []), _verdict(data)


def test_rank_spinning_while_its_peers_wait_is_the_root_cause(ray_cluster, shape, capsys):
    victim = shape("spin")
    code, data = settle(ray_cluster.address, victim, capsys, lambda c, d: _verdict(d)["culprits"])
    verdict = _verdict(data)
    assert code == 1 and [(c["rank"], c["rule"]) for c in verdict["culprits"]] == [(1, "peers")], verdict
    assert "without progress" in verdict["culprits"][0]["reason"]
    assert sorted(item["rank"] for item in verdict["consequences"] if item["rank"] is not None) == [0, 2]


def test_ranks_in_different_collectives_name_the_odd_one(ray_cluster, shape, capsys):
    victim = shape("op_mismatch")
    code, data = settle(ray_cluster.address, victim, capsys, lambda c, d: _verdict(d)["culprits"])
    verdict = _verdict(data)
    assert code == 1 and [(c["rank"], c["rule"]) for c in verdict["culprits"]] == [(1, "peers")], verdict
    assert "the ops differ" in verdict["culprits"][0]["reason"] and "broadcast" in verdict["culprits"][0]["reason"]


def test_checkpoint_barrier_longer_than_the_window_is_busy(ray_cluster, shape, capsys):
    victim = shape("checkpoint")
    for _ in range(2):  # rank 0 spends all but milliseconds of every few steps writing: both calls see the barrier
        code, data = stacks(ray_cluster.address, victim, capsys)
        assert (code, _verdict(data)["state"], _verdict(data)["culprits"]) == (0, "busy", []), _verdict(data)


def test_a_process_that_dies_between_the_samples_is_not_blamed_on_its_first_sample(ray_cluster, shape, capsys,
                                                                                   monkeypatch):
    """The loader is blocked for good and named; killed between the two samples, the first sample alone must
    not name it (its frames cannot have moved once it is gone): the verdict says it exited and cannot tell."""
    import os
    import signal

    import raysleuth.stacks.sampling as sampling

    victim = shape("blocked_call")
    code, data = settle(ray_cluster.address, victim, capsys, lambda c, d: _verdict(d)["culprits"])
    [culprit] = _verdict(data)["culprits"]
    assert (code, culprit["actor_class"], culprit["rule"]) == (1, "Loader", "wait-for chain"), _verdict(data)
    real, reads = sampling.thread_times, []

    def kill_after_the_first_read(targets, timeout=5.0):
        found = real(targets, timeout)
        reads.append(found)
        if len(reads) == 1:  # the counters before the window are read: the loader dies inside the window
            os.kill(culprit["pid"], signal.SIGKILL)
        return found

    monkeypatch.setattr(sampling, "thread_times", kill_after_the_first_read)
    code, data = stacks(ray_cluster.address, victim, capsys)
    verdict = _verdict(data)
    assert len(reads) == 2 and culprit["pid"] in {pid for _node, pid in reads[0][0]}, reads
    assert (code, verdict["state"], verdict["culprits"]) == (2, "unsure", []), verdict
    assert "Loader" in verdict["summary"] and "exited during the capture window" in verdict["summary"], verdict
    loader = next(p for p in data["processes"] if p["pid"] == culprit["pid"])
    assert loader["exited"] and "exited during the capture window" in loader["error"], loader
    assert any(item["pid"] == culprit["pid"] for item in data["missing"]), data["missing"]
