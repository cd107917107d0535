"""``raysleuth.evidence``: every kind reads its stored rows (old shapes too), the kinds table is the code's,
and no code outside the evidence package reads a record's ``data`` itself. No Ray.

The old shapes are rows as earlier versions stored them, written into a real store with
``EvidenceStore.add`` (what the recorder writes) and read back with ``evidence.read``.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from raysleuth import evidence
from raysleuth.recorder.store import open_run

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "raysleuth"
RUN_ROWS = ROOT / "tests" / "data" / "evidence" / "run.jsonl"

#: Per kind: (data as an earlier version stored it, what the reader must see). Kinds whose shape never
#: changed store their one shape; the versioned ones store their version 1.
OLD_SHAPES = {
    "debug_session": ({"id": "s1", "kind": "pdb", "state": "waiting", "port": 5678, "rank": 1}, {"state": "waiting"}),
    "doctor": ({"ok": False, "checks": [{"status": "fail", "name": "ray", "detail": "no ray"}]}, {"ok": False}),
    "consistency": ({"key": "params", "consistent": True, "world_size": 2, "tensors_checked": 0},
                    {"consistent": False, "nothing_compared": True}),
    "span": ({"start": 1.0, "end": 2.0, "duration_s": 1.0, "span_id": "a", "parent_id": None}, {"duration_s": 1.0}),
    "event": ({"path": "/tmp/ckpt"}, {}),
    "heartbeat": ({"step": 4}, {"step": 4}),
    "stack_report": ({"verdict": {"summary": "rank 1 is stuck", "culprits": [{"rank": 1, "pid": 9, "reason": "x"}]},
                      "groups": [{"count": 2, "ranks": [0, 1], "frames": [{"function": "f", "file": "a.py", "line": 3}]}]},
                     {}),
    "coroutines": ({"pid": 3, "count": 1, "tasks": [{"task": "Task-1", "awaits": "asyncio Event.wait"}]}, {"count": 1}),
    "collectives": ({"reason": "request", "rank": 0, "calls": [{"seq": 1, "op": "allreduce"}]}, {"delta": False}),
    "straggler": ({"state": "straggler", "summary": "rank 3 is late", "stragglers": [{"rank": 3}]},
                  {"state": "straggler"}),
    "stall": ({"summary": "rank 1 stalled", "stalled": [{"rank": 1, "step": 7}]}, {"summary": "rank 1 stalled"}),
    "finished": ({"summary": "every rank returned", "ranks": [{"rank": 0}]}, {"summary": "every rank returned"}),
    "crash": ({"exception_type": "ValueError", "message": "nan", "traceback": "Traceback...", "frames": [
        {"file": "job.py", "line": 3, "function": "update", "locals": {"x": "1"}}]}, {"skipped_before": 0}),
    "capsules_skipped": ({"reason": "rate limit", "max_capsules": 20, "window_s": 60}, {"max_capsules": 20}),
    "spool_dropped": ({"dropped_rows": 12, "cap_bytes": 1024, "spool": "a.jsonl"}, {"dropped_rows": 12}),
    "log": ({"msg": "loss spike", "logger": "train", "level": "warning"}, {"message": "loss spike"}),
    "memory": ({"rss_bytes": 1000, "uss_bytes": 900}, {"source": "watch", "rss_bytes": 1000}),
    "memory_capsule": ({"reason": "rss over 1 GiB", "value_bytes": 2**30}, {"value_bytes": 2**30}),
    "pool_call": ({"call_id": "c1", "function": "f", "state": "failed", "error": "boom"}, {"state": "failed"}),
    "verl_call": ({"method": "generate", "state": "submitted", "worker_name": "w0"}, {"method": "generate"}),
    "instrumented": ({"installed": ["crashes"], "errors": []}, {"installed": ("crashes",)}),
    "death": ({"cause": "sigkill", "summary": "killed", "evidence": ["dmesg"], "rank": 2}, {"cause": "sigkill"}),
    "rank": ({"rank": 3, "world_size": 4, "rank_source": "env"}, {"rank": 3}),
    "weight_sync": ({"side": "sent", "version": 1, "count": 2, "tensors": []}, {"side": "sent"}),
    "logprob_gap": ({"step": 2, "mean_abs": 0.01, "max_abs": 0.1, "tokens": 10}, {"mean_abs": 0.01}),
    "tasks": ({"pending": [{"name": "f", "state": "PENDING_NODE_ASSIGNMENT", "reason": "no GPU"}]}, {}),
}


def _label(kind: type[evidence.Evidence]) -> str:
    return kind.NAME or kind.KIND


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = open_run(tmp_path_factory.mktemp("evidence_shapes"), "shapes", take_latest=False)
    for kind in evidence.KINDS:
        data, _ = OLD_SHAPES[_label(kind)]
        store.add(kind.KIND, data, name=kind.NAME or "old", rank=1, step=2)
    yield store
    store.close()


def test_every_kind_has_an_old_shape() -> None:
    assert sorted(OLD_SHAPES) == sorted(_label(kind) for kind in evidence.KINDS)


@pytest.mark.parametrize("kind", evidence.KINDS, ids=_label)
def test_old_shape_still_reads(store, kind: type[evidence.Evidence]) -> None:
    data, expected = OLD_SHAPES[_label(kind)]
    found = [item for item in evidence.read(store, kind) if kind.NAME or item.row.name == "old"]
    assert len(found) == 1, found
    item = found[0]
    assert item.raw == data and item.row.rank == 1 and item.row.step == 2
    for field, value in expected.items():
        assert getattr(item, field) == value, field
    assert json.loads(json.dumps(item.to_data())) == item.to_data()  # what a writer stores is JSON


def test_old_shapes_are_told_apart() -> None:
    assert evidence.Consistency.version_of({"nothing_compared": False}) == 2
    assert evidence.Consistency.version_of({"tensors_checked": 0}) == 1
    assert evidence.Log.version_of({"msg": "x"}) == 1 and evidence.Log.version_of({"message": "x"}) == 2


def test_nested_parts_read_typed(store) -> None:
    crash = next(c for c in evidence.read(store, evidence.Crash) if c.row.name == "old")
    assert crash.frames[0].locals == {"x": "1"} and crash.frames[0].line == 3
    run = next(s for s in evidence.read(store, evidence.StackRun) if s.row.name == "old")
    assert run.verdict.culprits[0].rank == 1 and run.groups[0].frames[0].function == "f"


def test_rows_another_writer_left_read_with_defaults(tmp_path) -> None:
    store = open_run(tmp_path, "bad", take_latest=False)
    try:
        store.add("crash", {"exception_type": 7, "frames": "not a list", "explanations": [1, {"title": "t"}]})
        store.write_batch({}, [("crash", 1.0, None, None, None, None, None, [1, 2], None)])
        second, first = evidence.read(store, evidence.Crash)  # oldest first: the list row is at time 1
    finally:
        store.close()
    assert first.exception_type == "?" and first.frames == () and [e.title for e in first.explanations] == ["t"]
    assert second.raw == {"value": [1, 2]} and second.message == ""


def test_the_real_features_rows_read(tmp_path) -> None:
    """Every row of the frozen run (written by the features) reads as its kind, with the typed fields set."""
    import evidence_outputs

    from raysleuth.recorder.store import EvidenceStore

    store = EvidenceStore(evidence_outputs.load_run(tmp_path), readonly=True)
    try:
        crashes = evidence.read(store, evidence.Crash)
        logs = evidence.read(store, evidence.Log)
        checks = evidence.read(store, evidence.Consistency)
    finally:
        store.close()
    assert {c.exception_type for c in crashes} == {"ValueError"} and all(c.frames for c in crashes)
    assert {log.level for log in logs} == {"INFO", "WARNING", "ERROR"}
    assert [c.consistent for c in checks] == [True, False] and checks[1].mismatches[0].outlier_ranks == (1,)


def test_contributing_kinds_table_is_the_codes() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    start, end = "<!-- kinds table: python -c 'import raysleuth.evidence as e; print(e.kinds_table())' -->", \
        "<!-- end of kinds table -->"
    assert start in text and end in text, "CONTRIBUTING.md lost the markers of the generated kinds table"
    table = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert table == evidence.kinds_table().strip(), "regenerate the table: " + start


#: Where a ``.data`` attribute is read outside evidence/, recorder/ (the store) and cluster/records.py, and why.
ALLOWED = {
    "fingerprints/chunks.py": "a prepared tensor's bytes, not a record",
    "fingerprints/digest.py": "a prepared tensor's bytes, not a record",
}
#: Readers of record data not yet through evidence.read, by module and count (none left). A new one fails
#: the test; a line here is lowered or deleted when its module is converted (the test fails on a paid debt).
DEBT: dict[str, int] = {}


def _reads_data(node: ast.AST) -> bool:
    """``x.data``, ``x["data"]`` or ``x.get("data")``: a record's data read by hand."""
    if isinstance(node, ast.Attribute) and node.attr == "data":
        return True
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "data":
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "data")


def _data_reads() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("evidence/", "recorder/")) or rel == "cluster/records.py" or rel in ALLOWED:
            continue
        count = sum(_reads_data(node) for node in ast.walk(ast.parse(path.read_text())))
        if count:
            found[rel] = count
    return found


def test_record_data_is_read_only_through_evidence() -> None:
    found = _data_reads()
    new = {rel: count for rel, count in found.items() if count > DEBT.get(rel, 0)}
    assert not new, f"read these records through raysleuth.evidence.read (a kind's fields), not their data: {new}"
    paid = sorted(rel for rel, count in DEBT.items() if found.get(rel, 0) < count)
    assert not paid, f"these reads were converted: lower or delete their DEBT lines in tests/test_evidence.py: {paid}"
