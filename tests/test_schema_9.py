"""Schema 9: memory blocks as first values and steps (``recorder.deltas``), and each kind's count kept as rows are
written, changed and removed. A file of schema 8 (zlib blocks, no counts) answers the same."""

from __future__ import annotations

import sqlite3
import zlib

import numpy as np
import pytest

from raysleuth.memory import memory_report
from raysleuth.recorder import blocks, deltas, span_blocks
from raysleuth.recorder.schema import SCHEMA_VERSION
from raysleuth.recorder.store import EvidenceStore
from raysleuth.recorder.totals import span_columns, span_rows
from raysleuth.report import overview
from older_files import UNDO_9, as_schema_9
from test_memory_blocks import START, _odd_rows, _same_answers, _write, _written

I64 = np.iinfo(np.int64)


def test_first_values_and_steps_give_every_value_back_in_the_fewest_bytes():
    rng = np.random.default_rng(9)
    times = (1.78e9 + np.arange(3600.0) + rng.normal(0, 0.01, 3600)).view(np.int64)
    memory = 7 * 2**30 + rng.integers(-4, 5, 3600).cumsum() * 4096
    shapes = [np.vstack((times, np.arange(3600) * 1000, np.zeros(3600, dtype=np.int64), memory)),
              np.array([[I64.min, I64.max, 0, I64.min, -1, I64.max]]),  # steps that wrap past int64
              np.array([[5]]), np.zeros((3, 0), dtype=np.int64),
              np.array([[0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324]]).view(np.int64),
              rng.integers(I64.min, I64.max, (4, 100), dtype=np.int64, endpoint=True)]
    for columns in shapes:
        body = deltas.encode(columns)
        back = deltas.decode(body, *columns.shape)
        assert back.dtype == np.int64 and np.array_equal(back, columns)
        some = tuple(range(columns.shape[0]))[::-2]  # some columns, in another order
        assert np.array_equal(deltas.decode(body, *columns.shape, some), columns[list(some)])
    mixed = np.vstack((np.full(3600, 7), times, np.zeros(3600, dtype=np.int64), memory, np.full(3600, -3)))
    for some in ((0, 1, 2, 3, 4), (1, 2, 3, 0, 4, 3), (3, 1), (4, 0), (1, 3, 1)):  # runs of steps cut by constants
        assert np.array_equal(deltas.decode(deltas.encode(mixed), 5, 3600, some), mixed[list(some)])
    # runs of rows (a pass's block of every sender): each run's jump kept whole, apart; the rest as narrow as one run
    joined = np.hstack([mixed + 10**15 * run for run in range(4)] + [np.full((5, 7), I64.min)])
    breaks = [3600, 7200, 10800, 14400]
    body = deltas.encode(joined, breaks)
    assert body[0] == deltas.BREAKS and list(body[1:6]) == list(deltas.encode(mixed)[1:6])
    assert len(body) < 4 * len(deltas.encode(mixed)) + 8 * (1 + 4 + 5 * 4) + 64
    for some in (None, (0, 1, 2, 3, 4), (2,), (4, 0, 3)):
        back = deltas.decode(body, 5, joined.shape[1], some)
        assert np.array_equal(back, joined if some is None else joined[list(some)])
    assert np.array_equal(deltas.decode(deltas.encode(joined[:, :1], []), 5, 1), joined[:, :1])
    # the runs' first places and their values, off the breaks, for the columns that change only there (0 and 4)
    starts, values = deltas.run_starts(body, 5, joined.shape[1], (4, 0))
    assert starts.tolist() == [0, *breaks] and np.array_equal(values, joined[[4, 0]][:, starts])
    assert deltas.run_starts(body, 5, joined.shape[1], (1,)) is None  # times step within a run: decoded then
    assert deltas.run_starts(deltas.encode(mixed), 5, 3600, (0,)) is None  # no breaks
    one = deltas.run_starts(deltas.encode(mixed, []), 5, 3600, (0, 4))
    assert one[0].tolist() == [0] and one[1].tolist() == [[7], [-3]]
    with pytest.raises(ValueError):
        deltas.decode(body[:40], 5, joined.shape[1])
    body = deltas.encode(shapes[0])  # a second's time is 2**22 steps (4 bytes), ids 1000 (1: 125 << 3), one rank (0)
    assert list(body[1:9]) == [4, 1, 0, 1, 0, 3, 0, 12] and len(body) == 1 + 8 + 8 * 4 + (4 + 1 + 0 + 1) * 3599
    assert np.array_equal(deltas.decode(deltas.encode(-shapes[0][1:]), 3, 3600), -shapes[0][1:])  # shifted, signed
    with pytest.raises(ValueError):
        deltas.decode(zlib.compress(shapes[0].tobytes()), 4, 3600)
    with pytest.raises(ValueError):
        deltas.decode(body[:-1], 4, 3600)


def _as_schema_8(path) -> None:
    """Make a file what raysleuth wrote before schema 9: each block zlib (times, then the ints), no counts."""
    db = sqlite3.connect(path)
    as_schema_9(db)  # each pass's block of every sender as schema 9 wrote it
    for table, k in (("memory_blocks", 1 + len(blocks.INTS)), ("span_blocks", 1 + len(span_blocks.INTS))):
        for rowid, n, body in db.execute(f"SELECT rowid, n, body FROM {table} WHERE n >= 0").fetchall():
            columns = deltas.decode(body, k, n)
            db.execute(f"UPDATE {table} SET body = ? WHERE rowid = ?",
                       (zlib.compress(columns[0].view(np.float64).tobytes() + columns[1:].tobytes(), 1), rowid))
    for statement in (*UNDO_9, "PRAGMA user_version=8"):
        db.execute(statement)
    db.commit()
    db.close()


def test_a_schema_8_file_answers_as_it_did_and_migrates(tmp_path, monkeypatch):
    path, writer = _written(tmp_path, monkeypatch, 40)
    _odd_rows(writer)
    writer.close()
    new = EvidenceStore(path, readonly=True)
    assert new.schema_version == SCHEMA_VERSION == 10 and new._db.execute(
        "SELECT count(*) FROM memory_pass_blocks WHERE substr(body, 1, 1) = x'02'").fetchone()[0] > 3
    report, kinds = memory_report(new).to_dict(), new.kinds()
    totals = span_rows(span_columns(new))
    assert new._db.execute("SELECT count(*) FROM span_blocks WHERE n > 0 AND substr(body, 1, 1) = x'01'"
                           ).fetchone()[0] and len(totals) > 50
    curves = overview.memory_curves(new, {3})
    sealed = [(sender, source, times.tolist(), ints.tolist()) for sender, source, times, ints in
              blocks.read(new, blocks.top(new))]
    some = [(sender, source, times.tolist(), ints.tolist()) for sender, source, times, ints in
            blocks.read(new, blocks.top(new), ints=("v0", "rank"))]
    assert some == [(a, b, t, [i[3], i[1]]) for a, b, t, i in sealed]
    new.close()
    _as_schema_8(path)
    old = EvidenceStore(path, readonly=True)
    assert old.schema_version == 8 and old._db.execute(  # a block a sender, source and pass, each zlib
        "SELECT count(DISTINCT sender), min(substr(body, 1, 1)) FROM memory_blocks").fetchone() == (len(sealed), b"\x78")
    assert old._db.execute("SELECT count(*) FROM memory_blocks").fetchone()[0] > len(sealed)
    assert [(sender, source, times.tolist(), ints.tolist()) for sender, source, times, ints in
            blocks.read(old, blocks.top(old))] == sealed
    assert [(sender, source, times.tolist(), ints.tolist()) for sender, source, times, ints in
            blocks.read(old, blocks.top(old), ints=("v0", "rank"))] == some
    assert memory_report(old).to_dict() == report and old.kinds() == kinds
    assert span_rows(span_columns(old)) == totals and old._db.execute(
        "SELECT count(*) FROM span_blocks WHERE n > 0 AND substr(body, 1, 1) = x'01'").fetchone()[0] == 0
    assert overview.memory_curves(old, {3}) == curves
    _same_answers(old, monkeypatch)
    old.close()
    writer = EvidenceStore(path)  # migrates: counts from the rows, new blocks beside the old ones
    assert writer.kinds() == kinds
    _write(writer, ranks=[1, 4], samples=20, offset=7000)
    writer.close()
    both = EvidenceStore(path, readonly=True)
    marks = dict(both._db.execute("SELECT substr(body, 1, 1), count(*) FROM memory_blocks GROUP BY 1").fetchall())
    assert list(marks) == [b"\x78"] and both._db.execute("SELECT count(*) FROM memory_pass_blocks").fetchone()[0]
    _same_answers(both, monkeypatch)
    assert both.kinds() == dict(both._db.execute("SELECT kind, count(*) FROM entries GROUP BY kind ORDER BY kind"))
    both.close()


def test_the_counts_follow_every_row_written_changed_or_removed(tmp_path):
    store = EvidenceStore(tmp_path / "evidence.sqlite")
    _write(store, samples=14)
    counted = lambda: dict(store._db.execute(  # noqa: E731
        "SELECT kind, count(*) FROM entries GROUP BY kind ORDER BY kind"))
    assert store.kinds() == counted() and store.kinds()["memory"] == 6 * 14
    db = store._db
    db.execute("UPDATE entries SET kind = 'log' WHERE id IN (SELECT id FROM entries WHERE kind = 'span' LIMIT 3)")
    db.execute("UPDATE entries SET time = time + 1 WHERE kind = 'memory'")  # not the kind: no count moves
    db.execute("DELETE FROM entries WHERE kind = 'memory' AND rank = 2")
    db.execute("INSERT INTO records (kind, time, data) VALUES ('event', ?, '{}')", (START,))  # through the view
    db.commit()
    assert store.kinds() == counted() and store.kinds()["log"] == 3 and store.kinds()["event"] == 1
    db.execute("DELETE FROM entries WHERE kind = 'log'")
    db.commit()
    assert "log" not in store.kinds() and store.kinds() == counted()
    store.close()


def test_a_schema_9_file_answers_as_it_did_and_joins_both_layouts_once_migrated(tmp_path, monkeypatch):
    """Schema 10: a pass keeps one block of every sender (each sender's first step apart, so a jump from one
    worker's memory to the next, or from a null to a number, widens no other step). A file of schema 9 (a block a
    sender and source) answers the same; once a writer migrates it, a worker's samples in both layouts are read
    as one series, in id order."""
    path, writer = _written(tmp_path, monkeypatch, 40)
    _odd_rows(writer)
    writer.close()
    new = EvidenceStore(path, readonly=True)
    bodies = [body for (body,) in new._db.execute("SELECT body FROM memory_pass_blocks")]
    passes, rank = len(bodies), blocks.PASS_COLUMNS.index("rank")
    widths = [list(body[1:1 + len(blocks.PASS_COLUMNS)]) for body in bodies]
    assert passes > 3 and all(body[0] == deltas.BREAKS for body in bodies)
    # six workers' samples a pass, 2,000 MiB and more, some with no CUDA numbers (null): a step a byte at most
    # (the rank too, but where a worker's rank became known within the pass: from null)
    assert all(width <= 1 for each in widths for place, width in enumerate(each) if place != rank), widths
    listed = lambda store: [(sender, source, times.tolist(), ints.tolist())  # noqa: E731
                            for sender, source, times, ints in blocks.read(store, blocks.top(store))]
    sealed, report = listed(new), memory_report(new).to_dict()
    new.close()
    db = sqlite3.connect(path)
    as_schema_9(db)
    db.execute("PRAGMA user_version=9")
    db.commit()
    db.close()
    old = EvidenceStore(path, readonly=True)
    assert old.schema_version == 9 and old._db.execute("SELECT count(*) FROM memory_blocks").fetchone()[0] > \
        passes * 2  # a block a sender and source
    assert listed(old) == sealed and memory_report(old).to_dict() == report
    _same_answers(old, monkeypatch)
    old.close()
    writer = EvidenceStore(path)
    _write(writer, ranks=[1, 4], samples=50, offset=7000)
    writer.close()
    both = EvidenceStore(path, readonly=True)
    assert both._db.execute("SELECT count(*) FROM memory_blocks").fetchone()[0] and \
        both._db.execute("SELECT count(*) FROM memory_pass_blocks").fetchone()[0]
    joined = {sender: ints[0] for sender, _, _, ints in blocks.read(both, blocks.top(both))}
    assert all(bool((np.diff(ids) > 0).all()) for ids in joined.values())  # one series a worker, in id order
    assert sum(len(ids) for ids in joined.values()) == both._db.execute(
        f"SELECT count(*) FROM entries WHERE id <= ? AND {blocks.SEALED}", (blocks.top(both),)).fetchone()[0]
    _same_answers(both, monkeypatch)
    both.close()
