"""``timeline -o`` writes each event as JSON text itself, and past its budget keeps the newest records and says so.

A small real store written through ``EvidenceStore.write_batch`` (plus rows another writer could leave: not
JSON, not an object, odd numbers, non-ASCII names) is exported; the events must be exactly those the
record-by-record reader (``tests/scale_reference.py``) built, each spelled as the C JSON encoder spells it.
Pure store: no Ray.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from scale_reference import normal_events as _normal
from scale_reference import old_build_timeline, old_span_section

import raysleuth.timeline as timeline_module
from raysleuth.cli import main
from raysleuth.recorder.store import EvidenceStore
from raysleuth.timeline import build_timeline, export_timeline

START = 1_780_000_000.0
_C = json.JSONEncoder(separators=(",", ":"), default=repr).encode


def _identity(rank: int) -> dict:
    return {"world_size": 4, "node_id": f"node{rank % 2:02d}" * 4, "node_ip": f"10.0.0.{rank % 2 + 1}",
            "hostname": f"host{rank % 2}", "pid": 20_000 + rank, "actor_class": "TrainWorker", "client_id": f"c{rank}",
            "job_id": "01000000"}


def _odd_rows() -> list[tuple]:
    """Rows with attributes, an error, a Ray call, odd numbers, non-object data, a bool sample."""
    return [
        ("span", START + 20, 1, 3, "rollout", 'roll\u00e9 "x"', None,
         {"start": START + 20, "end": START + 21.5, "duration_s": 1.5, "span_id": 7, "parent_id": 3,
          "attrs": {"batch": 3, "flag": True, "step": 99, "nested": {"a": [1, 2.5, None]}},
          "error": {"type": "ValueError", "message": "bad \u2603"}}, 1),
        ("span", START + 22, 1, 3, None, "ray.call:Worker.step", None,
         {"start": START + 22, "end": START + 23, "span_id": "abc", "parent_id": None, "attrs": [1, 2]}, 2),
        ("span", START + 24, 1, 3, None, None, None, {"start": "x", "end": START + 10, "span_id": 5, "attrs": {}}, 3),
        ("span", START + 25, 1, 4, None, "huge", None, {"start": START + 25, "end": 1e999}, 4),
        ("event", START + 26, 1, 4, None, "checkpoint", "INFO",
         {"path": "/tmp/a\nb", "step": 42, "rank": "r", "x": 1e21, "y": -0.0}, 5),
        ("event", START + 27, 1, None, None, None, "INFO", [1, 2, 3], 6),
        ("heartbeat", START + 29, 1, 5, None, None, None, {"step": 5, "extra": "e"}, 7),
        ("heartbeat", START + 30, 1, 6, None, None, None, {"step": 6}, 8),
        ("memory", START + 31, 1, None, None, None, None,
         {"rss_bytes": 123456789, "flag_bytes": True, "text_bytes": "x", "big_bytes": 1.5e12, "other": 3}, 9),
        ("memory", START + 32, 1, None, None, None, None, {"nothing": 1}, 10),
    ]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    """4 ranks x 100 steps of spans, heartbeats and memory samples, plus the odd rows."""
    path = tmp_path_factory.mktemp("trace-text") / "runs" / "small" / "evidence.sqlite"
    path.parent.mkdir(parents=True)
    store = EvidenceStore(path)
    for rank in range(4):
        rows, seq = [], 0
        for step in range(100):
            begin = START + 10 * step + rank * 0.01
            rows.append(("span", begin, rank, step, "train_step", "train_step", None,
                         {"start": begin, "end": begin + 6.5 + rank, "duration_s": 6.5 + rank, "span_id": step + 1,
                          "parent_id": None, "attrs": {}}, seq))
            rows.append(("heartbeat", begin, rank, step, None, None, None, {"step": step}, seq + 1))
            rows.append(("memory", begin + 1, rank, step, None, None, None,
                         {"rss_bytes": 7 * 2**30 + step * 4096, "cuda_reserved_bytes": 35 * 2**30, "source": "watch"},
                         seq + 2))
            seq += 3
        store.write_batch(_identity(rank), rows)
    store.write_batch(_identity(1) | {"client_id": "odd", "actor_class": 'W\u00f6rker "q"'}, _odd_rows())
    store._db.execute("INSERT INTO records (kind, time, rank, step, data) VALUES ('heartbeat', ?, 3, 2, 'not json')",
                      (START + 9,))
    store._db.execute("INSERT INTO records (kind, time, rank, data) VALUES ('memory', ?, 3, '{bad json')", (START + 9,))
    store._db.commit()
    store.close()
    return path


def test_the_trace_text_is_the_encoders_and_the_events_are_the_old_readers(store_path, tmp_path):
    written = export_timeline(tmp_path / "t.json", run=str(store_path), ray_tasks=False)
    text = (tmp_path / "t.json").read_text()
    trace = json.loads(text)
    old = old_build_timeline(run=str(store_path), ray_tasks=False)
    assert _normal(trace["traceEvents"]) == _normal(old.events)
    assert written.written == len(old.events) and written.spans == old.spans == 404
    assert written.memory_samples == old.memory_samples == 401 and written.left_out == 0
    assert written.cut_since is None and not written.warnings
    body = text[len('{"traceEvents":['):text.index('],"displayTimeUnit"')]
    assert body == ",".join(_C(event) for event in trace["traceEvents"])  # every byte as json.dumps spells it
    events = {(event.get("cat"), event["name"]): event for event in trace["traceEvents"]}
    assert events[("span", 'roll\u00e9 "x"')]["args"] == {
        "step": 99, "rank": 1, "span_id": 7, "parent_id": 3, "batch": 3, "flag": True,
        "nested": {"a": [1, 2.5, None]}, "error": {"type": "ValueError", "message": "bad \u2603"}}
    assert ("span", "huge") in events
    assert {"rss_mb": 117.74, "flag_mb": 0.0, "big_mb": 1430511.47} in [
        event["args"] for event in trace["traceEvents"] if event.get("cat") == "memory"]
    built = build_timeline(run=str(store_path), ray_tasks=False)
    assert _normal(built.events) == _normal(old.events)
    steps = export_timeline(tmp_path / "s.json", run=str(store_path), ray_tasks=False, steps=(3, 5), ranks=[1, 2])
    old = old_build_timeline(run=str(store_path), ray_tasks=False, steps=(3, 5), ranks=[1, 2])
    assert _normal(json.loads((tmp_path / "s.json").read_text())["traceEvents"]) == _normal(old.events)
    assert steps.written == len(old.events)


def test_past_its_budget_the_trace_keeps_the_newest_records_and_says_what_it_left_out(store_path, tmp_path):
    cut = export_timeline(tmp_path / "cut.json", run=str(store_path), ray_tasks=False, limit=300)
    trace = json.loads((tmp_path / "cut.json").read_text())
    assert cut.cut_since is not None and cut.left_out > 0
    kept = cut.spans + cut.instant_events + cut.memory_samples
    assert 150 <= kept <= 300
    assert cut.left_out + kept == 1212  # every record is kept or counted as left out (the odd rows are early)
    timed = [event for event in trace["traceEvents"] if event["ph"] != "M"]
    assert timed and min(event["ts"] for event in timed) >= cut.cut_since * 1e6 - 1
    assert any("leaves" in warning and "--all" in warning for warning in cut.warnings)
    assert trace["otherData"]["warnings"] == cut.warnings
    # the same events as a trace asked for from that time on, with no budget
    same = export_timeline(tmp_path / "since.json", run=str(store_path), ray_tasks=False, since=cut.cut_since,
                           limit=None)
    assert _normal(json.loads((tmp_path / "since.json").read_text())["traceEvents"]) == _normal(trace["traceEvents"])
    assert same.written == cut.written and not same.warnings
    everything = export_timeline(tmp_path / "all.json", run=str(store_path), ray_tasks=False, limit=None)
    assert everything.left_out == 0 and everything.spans == 404


def test_the_cli_says_what_it_left_out_and_all_keeps_everything(store_path, tmp_path, monkeypatch):
    monkeypatch.setattr(timeline_module, "TRACE_LIMIT", 300)  # a small budget, as a big run meets the real one
    for extra in ((), ("--all",)):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["timeline", "-o", str(tmp_path / "t.json"), "--no-ray-tasks", "--run", str(store_path),
                         "--json", *extra])
        result = json.loads(out.getvalue())["timeline"]
        assert code == 0
        if extra:
            assert result["left_out"] == 0 and result["spans"] == 404 and not result["warnings"]
        else:
            assert result["left_out"] > 0 and result["cut_since"] and "--all" in result["warnings"][0]


def test_the_reports_step_section_is_what_it_was():
    """``span_section`` over totals with missing phases, Ray calls, ties, ints, non-finite and foreign values."""
    import random

    from raysleuth.report.sections import span_section

    rng = random.Random(27)
    for ranks in (3, 40):
        totals = []
        for step in range(30):
            for rank in range(ranks):
                for phase in ("forward", "backward", "ray.call:Worker.step", "opt"):
                    if rng.random() < 0.2:
                        continue  # a rank that did not record this phase in this step
                    seconds = rng.choice([round(rng.uniform(0.1, 2.0), 3), 1.0, 1, 5.0 if rank == 7 else 0.5])
                    totals.append((step, rank, phase, seconds))
        totals += [(3, 1, "forward", float("nan")), (4, 2, "opt", float("inf")), (5, None, "opt", 1.0),
                   (None, 1, "opt", 1.0), (6, 1, "opt", "x"), (7, 0, "forward", -0.0)]
        new, old = span_section(totals), old_span_section(totals)
        assert json.dumps(new, sort_keys=True) == json.dumps(old, sort_keys=True)  # NaN spelled, so it compares
        assert span_section(totals)["stragglers"]


def test_the_step_section_of_totals_as_sql_hands_them_is_read_in_columns_to_the_bit():
    """Totals in SQL's shape (one per step, rank and phase, in that order) take the numpy path, which answers as
    the rows did: three or more phases summed in order, ties (the first rank is the slowest), Ray calls left out
    of the stragglers, ranks missing from steps, -0.0, ints, and medians of an even count."""
    import random

    from raysleuth.report.sections import _span_columns, span_section

    rng = random.Random(38)
    for ranks in (2, 3, 40):
        totals = []
        for step in range(25):
            for rank in range(ranks):
                if rng.random() < 0.1:
                    continue  # a rank missing from a step
                for phase in ("backward", "forward", "opt", "ray.call:Worker.step"):
                    if rng.random() < 0.2:
                        continue
                    seconds = rng.choice([rng.uniform(0.1, 2.0), 0.1, 0.2, 1, -0.0, 5.0 if rank == 1 else 0.3])
                    totals.append((step, rank, phase, seconds))
        assert _span_columns(totals) is not None
        new, old = span_section(totals), old_span_section(totals)
        assert json.dumps(new, sort_keys=True) == json.dumps(old, sort_keys=True)
        assert new["stragglers"] and not any(s["phase"].startswith("ray.call:") for s in new["stragglers"])
    only_calls = [(step, rank, "ray.call:Worker.step", 1.0 + rank) for step in range(3) for rank in range(3)]
    assert _span_columns(only_calls) is not None and span_section(only_calls) == old_span_section(only_calls)
    sparse = [(rank * 1000 + step, rank, "step", 1.0) for rank in range(60) for step in range(30)]  # own step counts
    assert _span_columns(sparse) is None and span_section(sparse) == old_span_section(sparse)
    shuffled = list(reversed(totals))  # not SQL's order: the rows' path, same answer
    assert _span_columns(shuffled) is None
    assert json.dumps(span_section(shuffled), sort_keys=True) == json.dumps(old_span_section(shuffled), sort_keys=True)


def test_a_stored_run_whose_cluster_is_gone_is_read_without_importing_ray(tmp_path):
    """Nothing listens at the address: the trace is written and says Ray's task events were left out, and Ray
    (about 0.5 s of CPU to import) is never imported to learn that."""
    import os
    import subprocess
    import sys

    from raysleuth.recorder.store import open_run

    store = open_run(tmp_path, "gone")
    store.add("span", {"start": 1.0, "end": 2.0, "duration_s": 1.0, "span_id": 1}, time=1.0, rank=0, step=0,
              name="train_step", phase="train_step")
    store.close()
    src = str(Path(__file__).resolve().parent.parent / "src")
    probe = ("import runpy, sys; sys.argv = ['raysleuth', 'timeline', '-o', sys.argv[1]]\n"
             "try:\n    runpy.run_module('raysleuth', run_name='__main__')\n"
             "except SystemExit as done:\n    print('exit', done.code, 'ray' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "t.json")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": src, "RAYSLEUTH_HOME": str(tmp_path),
                                            "RAY_ADDRESS": "127.0.0.1:1"})
    assert done.stdout.split()[-3:] == ["exit", "0", "False"], (done.stdout, done.stderr[-2000:])
    assert "Ray task events left out" in done.stdout + done.stderr
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
