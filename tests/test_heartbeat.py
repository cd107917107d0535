"""Heartbeats, stall detection and the watchdog: unit tests, then one real rank that stops heart-beating."""

from __future__ import annotations

import json
import time

import pytest

import raysleuth as rs
from raysleuth.errors import UsageError
from raysleuth.stall import StallTracker, describe


def beats(rank, steps, start, every=1.0, pid=100):
    return [{"rank": rank, "step": s, "time": start + i * every, "pid": pid + rank} for i, s in enumerate(steps)]


def test_tracker_names_the_rank_that_stopped_while_peers_moved():
    tracker = StallTracker(stall=10)
    tracker.update(beats(0, range(30), 0) + beats(1, range(5), 0) + beats(2, range(30), 0))
    stalled, others, all_stopped = tracker.check(now=30)
    assert [r.rank for r in stalled] == [1] and not all_stopped
    assert stalled[0].step == 4 and stalled[0].pid == 101
    assert [r.rank for r in others] == [0, 2]
    assert describe(stalled, others, all_stopped, 30) == "rank 1 stalled at step 4 for 26s while peers reached step 29"
    tracker.mark_reported(stalled)
    assert tracker.check(now=31)[0] == []  # reported once
    tracker.update([{"rank": 1, "step": 5, "time": 32}])  # it moved again
    assert tracker.check(now=50)[0] and tracker.check(now=50)[2]  # later everyone stopped: reported anew


def test_tracker_repeated_beats_without_progress_are_a_stall():
    tracker = StallTracker(stall=5)
    tracker.update([{"rank": 0, "step": 7, "time": t} for t in range(20)] + beats(1, range(20), 0))
    stalled, _, _ = tracker.check(now=20)
    assert [r.rank for r in stalled] == [0]


def test_tracker_a_new_process_on_a_rank_starts_afresh():
    """An earlier job's ranks reached step 50; the new job's ranks restart at 0 and must not look stalled."""
    tracker = StallTracker(stall=5)
    tracker.update(beats(0, range(50), 0, pid=100) + beats(1, range(50), 0, pid=100))
    tracker.update(beats(0, range(20), 100, pid=200) + beats(1, range(3), 100, pid=200))
    stalled, others, _ = tracker.check(now=120)
    assert [r.rank for r in stalled] == [1] and stalled[0].pid == 201 and stalled[0].step == 2
    assert [r.rank for r in others] == [0]


def test_tracker_all_stopped_and_bad_stall():
    tracker = StallTracker(stall=5)
    tracker.update(beats(0, range(3), 0) + beats(1, range(3), 0))
    stalled, others, all_stopped = tracker.check(now=100)
    assert [r.rank for r in stalled] == [0, 1] and all_stopped and others == []
    assert describe(stalled, others, all_stopped, 100).startswith("every rank stopped")
    with pytest.raises(UsageError):
        StallTracker(stall=0)


def test_step_sets_the_step_and_heartbeats(tmp_path):
    from raysleuth import runtime
    from raysleuth.recorder import EvidenceStore, RecordClient, StoreSink, reset_client

    store = EvidenceStore(tmp_path / "evidence.sqlite")
    client = RecordClient(StoreSink(store), spool_dir=tmp_path / "spool")
    old = reset_client(client)
    try:
        with rs.step(7):
            assert runtime.current_step() == 7
        rs.heartbeat(8)
        assert client.flush(10)
    finally:
        reset_client(old)
        client.close()
    rows = store.query("heartbeat")
    assert [(r.step, r.data["step"]) for r in rows] == [(7, 7), (8, 8)]


def test_heartbeat_is_cheap():
    from raysleuth.recorder import RecordClient, reset_client

    class Nowhere:
        def deliver(self, header, rows):
            pass

    client = RecordClient(Nowhere())
    old = reset_client(client)
    try:
        started = time.perf_counter()
        for number in range(20_000):
            rs.heartbeat(number)
        per_call = (time.perf_counter() - started) / 20_000
    finally:
        reset_client(old)
        client.close()
    assert per_call < 50e-6, per_call  # a deque append, not a round trip


def test_watchdog_and_watch_catch_a_rank_that_stops(ray_cluster, capsys):
    import ray

    from raysleuth.cli import main
    from victims import hangs

    steppers, refs, pids = hangs.start_heartbeat_stall(world=3, stall_rank=1, stall_at=3)
    events = []
    dog = rs.watchdog(stall=4, on_stall=events.append, interval=0.5, stacks_timeout=60)
    try:
        event = dog.wait(timeout=90)
        assert event is not None, dog.error
        assert [r.rank for r in event.stalled] == [1] and event.stalled[0].pid == pids[1]
        assert event.stalled[0].step == 3 and not event.all_stopped
        assert events == [event]
        assert event.report is not None, event.error
        culprit = event.report.verdict.culprits[0]
        assert (culprit.rank, culprit.pid) == (1, pids[1]) and culprit.function.endswith("read_shard")
        assert "no heartbeat progress" in culprit.reason
        dog.stop()
        # the same from the command line, as JSON
        code = main(["watch", "--address", ray_cluster.address, "--stall", "4", "--json", "--duration", "60",
                     "--interval", "0.5", "--timeout", "60"])
        out = json.loads(capsys.readouterr().out)
        assert code == 1
        assert [r["rank"] for r in out["stalled"]] == [1]
        assert out["report"]["verdict"]["culprits"][0]["pid"] == pids[1]
        # the snapshot was stored as evidence
        from raysleuth import cluster
        from raysleuth.recorder import get_client, open_store

        get_client().flush(10)
        deadline = time.monotonic() + 30
        stored = []
        while time.monotonic() < deadline and not stored:
            stored = open_store(cluster.session_name(), home=ray_cluster.home).query("stack_report", name="watch")
            time.sleep(0.5)
        assert stored and stored[-1].data["verdict"]["culprits"][0]["pid"] == pids[1]
    finally:
        dog.stop()
        hangs.kill(*steppers)


def test_tracker_two_processes_with_one_rank_number_are_two_ranks():
    """Rank 0 hung while another process (another verl group, another job) also has RANK=0: its beats must
    not reset the hung one's progress."""
    tracker = StallTracker(stall=10)
    other = [{"rank": 0, "step": s, "time": float(s), "pid": 900, "job_id": "02000000"} for s in range(60)]
    hung = [{"rank": 0, "step": 3, "time": float(t), "pid": 100, "job_id": "02000000"} for t in range(0, 60, 5)]
    tracker.update(sorted(other + hung, key=lambda b: b["time"]))
    stalled, others, all_stopped = tracker.check(now=60)
    assert [(r.rank, r.pid) for r in stalled] == [(0, 100)] and not all_stopped
    assert [(r.rank, r.pid) for r in others] == [(0, 900)]


def test_stall_counted_in_collectives_says_collective_not_step():
    tracker = StallTracker(stall=5)
    tracker.update([{"rank": r, "step": 15, "time": 0.0, "pid": 10 + r, "source": "collectives"} for r in range(4)])
    stalled, others, all_stopped = tracker.check(now=20)
    assert describe(stalled, others, all_stopped, 20) == "every rank stopped: ranks 0, 1, 2, 3 at collective 15, " \
                                                          "no progress for 20s"
