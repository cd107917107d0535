"""``timeline --summary`` from the span blocks (schema 9): the same rows, to the bit and in the same order, as the
spans read row by row, on a real store whose spans hold every shape the row reader treats apart."""

from __future__ import annotations

import math
import sqlite3

import pytest

from raysleuth.recorder import blocks
from raysleuth.recorder.store import EvidenceStore
from raysleuth.timeline import summary
from raysleuth.timeline.summary import timeline_summary
from older_files import UNDO_9, as_schema_9
from test_span_blocks import START, _header, _span, _write


def _odd(store: EvidenceStore, steps: range) -> None:
    """Beside four ranks' steps: a worker with no rank (by pid), a Ray call, durations that are not finite, -0.0,
    text and a bool, a phase entered twice whose second span has the earlier clock, and a rank past the others."""
    for step in steps:
        rankless = {"node_id": "n9", "node_ip": "10.0.0.9", "pid": 7000 + step % 2, "client_id": f"loose-{step % 2}",
                    "job_id": "job-a"}
        seq = 10 * step
        store.write_batch(rankless, [("span", START + step + 0.2, None, step, None, "forward", None, _span(0.7), seq),
                                     ("span", START + step + 0.1, None, step, None, "forward", None, _span(0.2),
                                      seq + 1)])
        store.write_batch(_header(9, "job-b"), [
            ("span", START + step, 9, step, None, "forward", None, _span(math.inf if step % 3 == 0 else 0.3), seq),
            ("span", START + step + 0.3, 9, step, None, "ray.call:Worker.step", None, _span(5.0), seq + 2),
            ("span", START + step + 0.4, 9, step, None, "backward", None, _span(-0.0), seq + 3),
            ("span", START + step + 0.5, 9, step, None, "optimizer", None, _span("0.25" if step % 2 else True),
             seq + 4),
            ("span", START + step + 0.9, 9, step, None, "optimizer", None, _span(0.5), seq + 5),
            ("span", START + step + 0.6, 9, step, None, "optimizer", None, _span(1 / 7), seq + 6)])


@pytest.fixture
def path(tmp_path, monkeypatch):
    monkeypatch.setattr(blocks, "PASS_ROWS", 24)
    writer = EvidenceStore(tmp_path / "evidence.sqlite")
    _write(writer, range(30))
    _odd(writer, range(30))
    _write(writer, range(30, 33))  # past the newest pass: read row by row
    writer.close()
    return tmp_path / "evidence.sqlite"


def _rows_of(phases) -> list[tuple]:
    return [(p.step, p.phase, list(p.durations.items()), p.median_s, p.slowest, p.slowest_s, p.lag_s, p.lag_ratio)
            for p in phases]


CUTS = [{}, {"ranks": [1, 9]}, {"ranks": [2]}, {"steps": (3, 20)}, {"steps": (None, 4)}, {"jobs": ["job-b"]},
        {"jobs": "job-a"}, {"jobs": ["job-c"]}, {"since": START + 10}, {"ranks": [0, 1], "steps": (5, 31)}]


@pytest.mark.parametrize("cut", CUTS)
def test_the_blocks_give_the_rows_answer(path, monkeypatch, cut):
    from_blocks = _rows_of(timeline_summary(run=str(path), **cut))
    with monkeypatch.context() as patch:
        patch.setattr(summary, "_grouped_from_blocks", lambda *args: None)
        from_rows = _rows_of(timeline_summary(run=str(path), **cut))
    assert from_blocks == from_rows and (from_rows or cut.get("jobs") == ["job-c"]), cut


def test_the_blocks_are_read_and_hold_most_spans(path):
    store = EvidenceStore(path, readonly=True)
    held = store._db.execute("SELECT sum(n) FROM span_blocks WHERE n > 0").fetchone()[0]
    grouped = summary._grouped_from_blocks(store, None, None, None, None)
    assert held > 300 and grouped is not None and ("pid 7000" in grouped[(4, "forward")])
    assert list(grouped[(4, "forward")])[:1] == ["pid 7000"]  # no rank: first, as SQLite's NULLs come
    assert grouped[(4, "optimizer")]["9"] == ((0.0 + 1.0) + 1 / 7) + 0.5  # time order; True reads as 1.0
    assert grouped[(5, "optimizer")]["9"] == ((0.0 + 0.25) + 1 / 7) + 0.5  # "0.25" reads as 0.25
    assert grouped[(4, "forward")]["pid 7000"] == (0.0 + 0.2) + 0.7  # the earlier clock first
    phases = {(p.step, p.phase): p for p in timeline_summary(run=str(path))}
    assert phases[(3, "forward")].durations["9"] == 0.0 and phases[(4, "backward")].durations["9"] == 0.0
    assert math.copysign(1.0, phases[(4, "backward")].durations["9"]) == 1.0  # -0.0 adds to 0.0
    assert not any(phase.startswith("ray.call:") for _, phase in phases)
    store.close()


def test_a_file_before_schema_9_reads_the_rows(path, monkeypatch):
    expected = _rows_of(timeline_summary(run=str(path)))
    db = sqlite3.connect(path)
    as_schema_9(db)  # each pass's block of every sender as schema 9 wrote it
    for statement in (*UNDO_9, "PRAGMA user_version=8"):
        db.execute(statement)
    db.commit()
    db.close()
    store = EvidenceStore(path, readonly=True)
    assert summary._grouped_from_blocks(store, None, None, None, None) is None
    store.close()
    assert _rows_of(timeline_summary(run=str(path))) == expected
