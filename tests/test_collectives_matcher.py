"""The collective matcher on saved dumps of real gloo jobs (tests/data/collectives/, no Ray here).

The dumps were recorded by ``python -m victims.record_collective_dumps``: a
3-rank gloo job (victims/collective_faults.py) where rank 1 breaks the
sequence at step 4, raysleuth given only as Ray's worker setup hook.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from raysleuth.collectives import collective_culprits, match
from raysleuth.collectives.model import Entry, RankPositions, entries_from_dump, positions_from_records

DATA = Path(__file__).parent / "data" / "collectives"


def load(fault: str) -> dict:
    return json.loads((DATA / f"{fault}.json").read_text())


def verdict(fault: str, **options):
    saved = load(fault)
    positions = positions_from_records(saved["records"], alive={tuple(a) for a in saved["alive"]})
    return match(positions, **options)


@pytest.mark.parametrize("fault, kind", [("skip", "skipped"), ("shape", "shape"), ("op", "op"),
                                         ("stuck", "stuck"), ("die", "dead")])
def test_saved_fault_names_rank_1_and_the_kind(fault, kind):
    result = verdict(fault)
    assert [(c.rank, c.kind) for c in result.culprits] == [(1, kind)]
    culprit = result.culprits[0]
    assert culprit.rule == "collective positions" and culprit.group == "0"
    assert culprit.file and culprit.file.endswith("collective_faults.py") and culprit.line


def test_skipped_reads_like_the_issue_says():
    reason = verdict("skip").culprits[0].reason
    assert reason.startswith("rank 1 is one collective behind: ranks 0,2 called all_reduce(float32[1]) as #10")
    assert "rank 1 called all_reduce(float32[64,64]) — rank 1 skipped one (collective_faults.py:" in reason
    assert "call 5 at collective_faults.py" in reason  # step 4 is the 5th call from that line


def test_mismatch_reasons_name_both_calls():
    assert "all_reduce(float32[2])" in verdict("shape").culprits[0].reason
    assert "broadcast(float32[1])" in verdict("op").culprits[0].reason


def test_stuck_and_dead_say_where_the_others_wait():
    stuck = verdict("stuck").culprits[0]
    assert "never entered #9" in stuck.reason and "ranks 0,2 wait in #9" in stuck.reason
    dead = verdict("die").culprits[0]
    assert "rank 1's process is dead" in dead.reason and "ranks 0,2 wait in #10" in dead.reason


def test_healthy_job_has_no_culprit_and_all_ranks_aligned():
    result = verdict("healthy")
    assert result.culprits == []
    (group,) = result.groups
    assert group.label == "default_pg" and group.ranks == [0, 1, 2] and set(group.last.values()) == {16}
    assert [row["seq"] for row in group.rows] == list(range(9, 17))
    assert all(set(row["ranks"]) == {0, 1, 2} for row in group.rows)


def test_without_liveness_a_dead_rank_reads_as_stuck_not_as_healthy():
    saved = load("die")
    result = match(positions_from_records(saved["records"]))
    assert [(c.rank, c.kind) for c in result.culprits] == [(1, "stuck")]


def test_flight_recorder_lagging_behind_a_returned_call_still_reads_stuck():
    """gloo marks a collective completed in the Flight Recorder a moment after the call returned (CI saw it lag
    while rank 1 sat in its data loader): the wrapper saw the blocking call return, so it completed."""
    saved = load("stuck")
    records = copy.deepcopy(saved["records"])
    for record in records:
        if record["data"]["rank"] == 1:
            record["data"]["flight_recorder"]["pg_status"]["0"]["last_completed_collective"] = "7"
    result = match(positions_from_records(records, alive={tuple(a) for a in saved["alive"]}))
    assert [(c.rank, c.kind) for c in result.culprits] == [(1, "stuck")]
    assert "never entered #9" in result.culprits[0].reason


def test_a_call_still_inside_gloo_reads_pending_even_if_the_wrapper_returned_an_earlier_one():
    saved = load("stuck")
    record = [r for r in saved["records"] if r["data"]["rank"] == 0][-1]
    entries = entries_from_dump(record["data"])["0"]
    assert entries[9].state == "pending" and entries[8].state == "completed"


@pytest.mark.parametrize("fault", ["skip", "shape", "op", "stuck"])
def test_wrapper_only_records_give_the_same_culprit(fault):
    """Where torch's Flight Recorder is off, the wrapper's own sequence numbers are aligned instead."""
    saved = load(fault)
    records = copy.deepcopy(saved["records"])
    for record in records:
        record["data"]["flight_recorder"] = None
    positions = positions_from_records(records, alive={tuple(a) for a in saved["alive"]})
    result = match(positions)
    assert [c.rank for c in result.culprits] == [1]


def test_flight_recorder_entries_carry_the_wrapper_frame():
    record = load("shape")["records"][-1]
    entries = entries_from_dump(record["data"])["0"]
    assert all(e.file and e.file.endswith("collective_faults.py") for e in entries.values())
    assert {e.op for e in entries.values()} == {"all_reduce"}


def test_an_entry_no_worker_writes_is_left_out_and_the_rest_of_its_dump_read():
    """A NaN time, a seq that is not a number, an entry that is not an object, arrays that are not arrays: the
    well-formed entries of the real dump are read as they are, the others left out, nothing raises (a dump like
    that made ``collectives --run`` an internal error)."""
    record = load("shape")["records"][-1]
    whole = entries_from_dump(record["data"])
    data = copy.deepcopy(record["data"])
    recorded = data["flight_recorder"]["entries"]
    recorded += [7, {"collective_seq_id": "x", "process_group": ["0"]},
                 {"collective_seq_id": 10**6, "process_group": ["0"], "time_created_ns": float("nan")},
                 {"collective_seq_id": 10**6 + 1, "process_group": 5}]
    data["calls"] = data["calls"] + [{"pg": "0", "seq": 10**6, "start_ns": float("nan"), "state": "started"}]
    assert entries_from_dump(data) == whole
    wrapper_only = dict(copy.deepcopy(record["data"]), flight_recorder=[1, 2])  # a list: its calls are read
    wrapper_only["calls"] += [{"pg": "0", "seq": "x"}, {"pg": "0"}, 3]
    assert entries_from_dump(wrapper_only) == entries_from_dump(dict(record["data"], flight_recorder=None))
    assert entries_from_dump({"calls": 5, "flight_recorder": {"entries": 3, "pg_status": []}}) == {}


def test_collective_culprits_is_the_stacks_rule():
    saved = load("skip")
    culprits = collective_culprits(saved["records"], alive={tuple(a) for a in saved["alive"]})
    assert len(culprits) == 1
    culprit = culprits[0]
    assert culprit["rank"] == 1 and culprit["rule"] == "collective positions" and culprit["kind"] == "skipped"
    assert {"reason", "file", "line", "step", "pid", "node_ip", "seq", "group"} <= set(culprit)
    json.dumps(culprits)


def test_records_of_an_older_job_are_left_out():
    old, new = load("healthy")["records"], load("stuck")["records"]  # stuck was recorded later
    positions = positions_from_records(old + new)
    assert {p.pid for p in positions} == {r["pid"] for r in new}


# ---------------------------------------------------------------- synthetic edge cases


def _rank(rank: int, entries: list[Entry], *, dumped_at: float = 100.0, alive: bool | None = True,
          group: str = "0", desc: str = "default_pg") -> RankPositions:
    return RankPositions(rank=rank, pid=1000 + rank, alive=alive, dumped_at=dumped_at,
                         groups={group: {e.seq: e for e in entries}}, group_info={group: {"desc": desc, "ranks": []}})


def _ar(seq: int, shape=(4,), state="completed", created=50.0, dtype="float32", op="all_reduce") -> Entry:
    return Entry(seq=seq, op=op, inputs=[[list(shape), dtype]], state=state, created=created)


def test_busy_job_dumped_at_different_moments_is_healthy():
    ranks = [_rank(0, [_ar(s) for s in range(1, 6)] + [_ar(6, state="pending", created=99.0)]),
             _rank(1, [_ar(s) for s in range(1, 4)])]
    assert match(ranks).culprits == []


def test_two_ranks_tie_without_a_pattern_names_nobody():
    ranks = [_rank(0, [_ar(1, shape=(3,), state="pending")]), _rank(1, [_ar(1, shape=(5,), state="pending")])]
    assert match(ranks).culprits == []


def test_dtype_mismatch():
    ranks = [_rank(r, [_ar(1), _ar(2, state="pending")]) for r in (0, 1)]
    ranks.append(_rank(2, [_ar(1), _ar(2, dtype="float64", state="pending")]))
    (culprit,) = match(ranks).culprits
    assert (culprit.rank, culprit.kind) == (2, "dtype")


def test_lone_rank_waiting_in_a_collective_nobody_else_entered_is_ahead():
    ranks = [_rank(r, [_ar(1), _ar(2)]) for r in (0, 1, 2)]
    ranks.append(_rank(3, [_ar(1), _ar(2), _ar(3, state="pending", created=10.0)]))
    (culprit,) = match(ranks).culprits
    assert (culprit.rank, culprit.kind) == (3, "ahead")


def test_named_group_is_labelled_and_filtered():
    ranks = [_rank(r, [_ar(1)] if r else [_ar(1), _ar(2, state="pending", created=10.0)],
                   group="3", desc="actor_rollout_weight_sync") for r in (0, 1)]
    result = match(ranks, group="actor_rollout_weight_sync")
    assert result.groups[0].label == "actor_rollout_weight_sync"
    assert [(c.rank, c.kind) for c in result.culprits] == [(1, "stuck")]
    assert "actor_rollout_weight_sync" in result.culprits[0].reason
    assert match(ranks, group="other").groups == []


def test_no_records_says_so():
    assert "no collective records" in match([]).summary


def test_report_has_a_collectives_section_from_a_stored_run(tmp_path):
    from raysleuth.recorder.store import EvidenceStore
    from raysleuth.report import generate_report

    store = EvidenceStore(tmp_path / "runs" / "session_x" / "evidence.sqlite")
    for record in load("op")["records"]:
        store.add("collectives", record["data"], time=record["time"], rank=record["rank"], name=record["name"],
                  pid=record["pid"], node_ip=record["node_ip"])
    store.close()
    result = generate_report(tmp_path / "report.html", run="session_x", home=tmp_path)
    text = (tmp_path / "report.html").read_text()
    assert result.sections["collectives"] == 1
    assert "<h2>Collectives</h2>" in text and "rank 1 called another op as #10" in text
    assert "broadcast(float32[1])" in text


def test_an_nccl_call_that_returned_is_not_completed_until_the_flight_recorder_says_so():
    """An NCCL collective returns once queued on the GPU stream: a rank hung inside it has 'returned'."""
    record = copy.deepcopy([r for r in load("stuck")["records"] if r["data"]["rank"] == 1][-1]["data"])
    record["flight_recorder"]["pg_status"]["0"]["last_completed_collective"] = "7"
    assert entries_from_dump(record)["0"][8].state == "completed"  # gloo: the blocking call returned
    for entry in record["flight_recorder"]["entries"]:
        entry["profiling_name"] = entry["profiling_name"].replace("gloo:", "nccl:")
    entries = entries_from_dump(record)["0"]
    assert entries[8].state == "pending" and entries[7].state == "completed" and entries[8].op == "all_reduce"


def test_gloo_and_nccl_flight_recorders_are_read_together():
    """torch keeps one Flight Recorder per event kind (gloo's, NCCL's); a job with both groups needs both."""
    from types import SimpleNamespace

    from raysleuth.collectives.record import _read_fr

    def dump(group, enqueued, op):
        entry = {"collective_seq_id": 1, "profiling_name": op, "process_group": [group, group]}
        return json.dumps({"version": "2.10", "entries": [entry] if enqueued > 0 else [],
                           "pg_status": {"0": {"last_enqueued_collective": str(enqueued)},
                                         group: {"last_enqueued_collective": str(enqueued)}}}).encode()

    bindings = SimpleNamespace(_dump_fr_trace_json=lambda includeCollectives: dump("1", 1, "gloo:all_reduce"),
                               _dump_nccl_trace_json=lambda includeCollectives: dump("0", 3, "nccl:all_reduce"))
    merged = _read_fr(bindings, True)
    assert [e["profiling_name"] for e in merged["entries"]] == ["gloo:all_reduce", "nccl:all_reduce"]
    assert merged["pg_status"]["0"]["last_enqueued_collective"] == "3"  # the recorder that group really used
    assert merged["pg_status"]["1"]["last_enqueued_collective"] == "1"
    assert _read_fr(SimpleNamespace(_dump_fr_trace_json=lambda includeCollectives: b"not json"), True) is None


def test_an_old_dump_of_a_pending_rank_is_not_stuck_now():
    """Rank 1 was dumped mid-collective (pending 0.2 s) and has not dumped since: it was busy, not stuck, even
    if that dump is old. Only a dump that itself saw the wait past pending_after says it stopped."""
    ranks = [_rank(0, [_ar(s) for s in range(1, 40)], dumped_at=200.0),
             _rank(1, [_ar(1), _ar(2, state="pending", created=99.8)], dumped_at=100.0)]
    assert match(ranks).culprits == []
    ranks[1] = _rank(1, [_ar(1), _ar(2, state="pending", created=90.0)], dumped_at=100.0)  # it saw 10 s
    assert [c.rank for c in match(ranks).culprits] == [1]


def _report(ranks, *, answered, alive=(0, 1), unknown=()):
    from raysleuth.collectives.report import CollectivesReport, missing_data

    report = CollectivesReport(run="r", job_id="j", live=True, requested=True, answered=answered,
                               ranks=[{"rank": p.rank, "alive": None if p.rank in unknown else p.rank in alive,
                                       "dumped_at": p.dumped_at} for p in ranks], verdict=match(ranks, last=4))
    report.missing, report.unanswered = missing_data(report, True, None)
    return report


def test_a_live_rank_that_did_not_answer_is_cannot_tell_not_a_problem():
    ranks = [_rank(0, [_ar(s) for s in range(1, 40)], dumped_at=200.0), _rank(1, [_ar(s) for s in range(1, 9)])]
    late = _report(ranks, answered=[0])
    assert late.unanswered == [1] and late.missing == [] and late.exit_code == 2
    assert "did not answer" in late.to_dict()["summary"]
    gone = _report(ranks, answered=[0], alive=(0,))  # the same positions, but the process is dead
    assert gone.unanswered == [] and "left no positions" in gone.missing[0] and gone.exit_code == 1
    unknown = _report(ranks, answered=[0], unknown=(1,))  # the State API did not say whether it lives
    assert unknown.unanswered == [1] and unknown.missing == [] and unknown.exit_code == 2
    ranks[1] = _rank(1, [_ar(s) for s in range(1, 39)], dumped_at=200.0)
    assert _report(ranks, answered=[0, 1]).exit_code == 0


def test_a_rank_that_answered_a_moment_before_its_peers_is_not_silent():
    """A healthy job at 20 collectives a second: rank 1 answered the request 0.4 s before rank 0, so its newest
    entries end 8 collectives earlier and none is in the newest rows shown. It answered, with positions: not
    "left no positions" (that was a false exit 1 on a healthy job)."""
    ranks = [_rank(0, [_ar(s) for s in range(1, 377)], dumped_at=200.4),
             _rank(1, [_ar(s) for s in range(1, 369)], dumped_at=200.0)]
    report = _report(ranks, answered=[0, 1])
    assert report.missing == [] and report.unanswered == [] and report.exit_code == 0, report.to_dict()["summary"]
