"""Top-level spans sealed into blocks at the writer's passes (schema 7, ``recorder.span_blocks``): the report's step
totals read from them answer what SQL's ``GROUP BY`` over the rows answers.

The store is the real one (SQLite, the writer's own ``write_batch`` and passes); the reference is
``totals.span_totals`` (SQL over every row, which never reads a block) and ``span_columns`` with the blocks
ignored.
"""

from __future__ import annotations

import sqlite3

import pytest

from raysleuth.recorder import blocks, span_blocks
from raysleuth.recorder.store import EvidenceStore
from raysleuth.recorder.totals import span_columns, span_rows, span_totals
from older_files import UNDO_9, as_schema_9

START = 1_780_000_000.0
MiB = 2**20


def _header(rank: int, job: str) -> dict:
    return {"node_id": f"node{rank % 2}", "node_ip": f"10.0.0.{rank % 2}", "pid": 5000 + rank,
            "client_id": f"client-{rank}", "job_id": job, "world_size": 4}


def _span(duration, parent=None) -> dict:
    return {"start": 1.0, "end": 2.0, "duration_s": duration, "span_id": 1, "parent_id": parent}


def _write(store: EvidenceStore, steps: range, *, job_of=lambda rank: "job-a" if rank < 3 else "job-b") -> None:
    """Four ranks a step, as a client delivers them: a memory sample (what starts a pass), a forward entered twice
    (summed), a nested span (no total), an integer duration, one past 2**31 (read row by row), a span with no
    duration, and a phase with no name."""
    for step in steps:
        for rank in range(4):
            seq = step * 10
            rows = [("memory", START + step, rank, step, None, None, None,
                     {"rss_bytes": 2000 * MiB, "uss_bytes": 1900 * MiB, "cuda_allocated_bytes": None,
                      "cuda_reserved_bytes": None, "cuda_peak_bytes": None, "source": "watch"}, seq),
                    ("span", START + step, rank, step, None, "forward", None, _span(0.1 * (rank + 1)), seq + 1),
                    ("span", START + step + 0.5, rank, step, None, "forward", None, _span(1 / 3), seq + 2),
                    ("span", START + step + 0.6, rank, step, None, "inner", None, _span(9.0, parent=5), seq + 3),
                    ("span", START + step + 0.7, rank, step, "backward", None, None, _span(2), seq + 4),
                    ("span", START + step + 0.8, rank, step, None, "idle", None, _span(None), seq + 5)]
            if rank == 1 and step % 4 == 0:
                rows.append(("span", START + step + 0.9, rank, step, None, "huge", None, _span(2**40), seq + 6))
            store.write_batch(_header(rank, job_of(rank)), rows)


def _rows_only(monkeypatch, store, job=None):
    with monkeypatch.context() as patch:
        patch.setattr(span_blocks, "read", lambda *args, **kwargs: None)
        return span_columns(store, job=job)


def _same_answers(store: EvidenceStore, monkeypatch) -> None:
    for job in (None, ["job-a"], ["job-b"], "job-b", ["job-c"]):
        expected = list(span_totals(store, job=job))
        columns = span_columns(store, job=job)
        assert columns is not None and span_rows(columns) == expected, job
        rows = _rows_only(monkeypatch, store, job)
        assert rows is not None and span_rows(rows) == expected, job


@pytest.fixture
def written(tmp_path, monkeypatch):
    monkeypatch.setattr(blocks, "PASS_ROWS", 24)  # a pass every six steps of four ranks
    path = tmp_path / "evidence.sqlite"
    writer = EvidenceStore(path)
    _write(writer, range(40))
    return path, writer


def test_the_passes_seal_the_top_level_spans_and_the_totals_are_sqls(written, monkeypatch):
    path, writer = written
    _write(writer, range(40, 43))  # past the newest pass: read row by row
    writer._db.execute("INSERT INTO records (kind, time, rank, step, name, data) VALUES ('span', ?, 2, 3, "
                       "'forward', '{\"duration_s\": 2.5, \"parent_id\": null}')", (START,))  # JSON alone, no sender
    writer._db.commit()
    reader = EvidenceStore(path, readonly=True)
    high = blocks.top(reader)
    assert high and reader._db.execute("SELECT count(*) FROM block_passes").fetchone()[0] >= 5
    with blocks.snapshot(reader):
        sealed = span_blocks.read(reader)
    # every top-level span with a number below the top, except the durations past 2**31, is in a block
    assert sealed is not None and len(sealed.ids) == reader._db.execute(
        "SELECT count(*) FROM entries WHERE kind = 'span' AND id <= ? AND coalesce(name, '') != 'inner' AND v0 IS NOT NULL "
        "AND v0 < 2147483648", (high,)).fetchone()[0] > 100
    assert sealed.names == ["backward", "forward"] and set(sealed.seconds.tolist()) >= {1 / 3, 2.0}
    _same_answers(reader, monkeypatch)

    statements: list[str] = []  # the rows handed over one by one: only those past the top and the loose ones
    reader._db.set_trace_callback(statements.append)
    try:
        span_columns(reader)
    finally:
        reader._db.set_trace_callback(None)
    picked = [sql for sql in statements if "id > " in sql or "span_loose" in sql]
    assert picked and all("id > 0 " not in sql for sql in picked), statements
    for sql in picked:
        plan = " ".join(row[3] for row in reader._db.execute("EXPLAIN QUERY PLAN " + sql))
        assert "PRIMARY KEY" in plan or "span_loose" in plan, (sql, plan)
    reader.close()
    writer.close()


def test_a_span_written_changed_or_removed_below_a_pass_drops_it_and_the_later_ones(written, monkeypatch):
    path, writer = written
    writer.close()
    db = sqlite3.connect(path)

    def in_middle_pass() -> int:
        passes = db.execute("SELECT lo, hi FROM block_passes ORDER BY hi").fetchall()
        return db.execute("SELECT id FROM entries WHERE kind = 'span' AND name = 'forward' AND id > ? AND id <= ? "
                          "ORDER BY id LIMIT 1", passes[len(passes) // 2]).fetchone()[0]

    def update() -> int:
        row = in_middle_pass()
        db.execute("UPDATE entries SET v0 = 7.25 WHERE id = ?", (row,))  # the copy, as a row changed by hand
        return row

    def delete() -> int:
        row = in_middle_pass()
        db.execute("DELETE FROM records WHERE id = ?", (row,))
        return row

    def insert() -> int:  # a span written into a removed span's place below the top
        row = in_middle_pass()
        db.execute("DELETE FROM entries WHERE id = ?", (row,))
        db.commit()
        blocks.seal(db)  # sealed again, the place empty below the top
        db.execute("INSERT INTO records (id, kind, time, rank, step, name, data, pid, client_id, job_id, node_id) "
                   "VALUES (?, 'span', ?, 0, 1, 'forward', '{\"duration_s\": 4.0}', 5000, 'client-0', 'job-a', "
                   "'node0')", (row, START))
        return row

    for edit in (update, delete, insert):
        before = db.execute("SELECT max(hi) FROM block_passes").fetchone()[0]
        edited = edit()
        db.commit()
        after = db.execute("SELECT coalesce(max(hi), 0) FROM block_passes").fetchone()[0]
        assert after < edited <= before, (edit.__name__, before, after)
        assert db.execute("SELECT count(*) FROM span_blocks WHERE pass > ?", (after,)).fetchone()[0] == 0
        reader = EvidenceStore(path, readonly=True)
        _same_answers(reader, monkeypatch)
        assert (1, 0, "forward", 4.0 + 0.1 + 1 / 3) in list(span_totals(reader)) or edit is not insert
        reader.close()
    db.close()
    writer = EvidenceStore(path)  # the next pass seals again what the dropped ones held
    _write(writer, range(40, 50))
    writer.close()
    reader = EvidenceStore(path, readonly=True)
    assert blocks.top(reader) == reader._db.execute("SELECT max(id) FROM entries").fetchone()[0]
    _same_answers(reader, monkeypatch)
    reader.close()


def test_passes_made_before_schema_7_have_their_spans_read_row_by_row(tmp_path, monkeypatch):
    """A version 6 file's passes hold no spans: a writer that opens it marks them (n = -1), readers read their
    ids' spans row by row, and its own passes seal the spans after."""
    monkeypatch.setattr(blocks, "PASS_ROWS", 24)
    path = tmp_path / "evidence.sqlite"
    writer = EvidenceStore(path)
    _write(writer, range(20))
    writer.close()
    db = sqlite3.connect(path)  # made a version 6 file: what migration 7 added, removed
    as_schema_9(db)  # each pass's block of every sender as schema 9 wrote it
    for statement in (*UNDO_9, "DROP INDEX log_severe", "DROP TRIGGER span_blocks_insert",
                      "DROP TRIGGER span_blocks_update",
                      "DROP TRIGGER span_blocks_delete", "DROP TRIGGER span_blocks_pass", "DROP INDEX span_loose",
                      "DROP TABLE span_blocks", "PRAGMA user_version=6"):
        db.execute(statement)
    db.commit()
    db.close()
    old = EvidenceStore(path, readonly=True)
    assert old.schema_version == 6 and blocks.top(old) and span_blocks.read(old) is None
    expected = list(span_totals(old))
    assert span_rows(span_columns(old)) == expected
    old.close()
    writer = EvidenceStore(path)  # migrates to 7: the old passes marked, the new ones sealed
    _write(writer, range(20, 40))
    writer.close()
    reader = EvidenceStore(path, readonly=True)
    marked = reader._db.execute("SELECT count(*) FROM span_blocks WHERE n = -1").fetchone()[0]
    assert marked >= 2 and reader._db.execute("SELECT count(*) FROM span_blocks WHERE n > 0").fetchone()[0] >= 2
    _same_answers(reader, monkeypatch)
    assert set(expected) <= set(span_totals(reader))
    reader.close()


def test_a_pass_reads_what_span_sealed_admits_off_the_loose_index(written):
    """The pass finds the spans ``SPAN_SEALED`` admits through ``span_loose`` (the spans it leaves out, tested once
    when written): the same rows as the test on every span, loose ones among them."""
    from raysleuth.recorder.schema import SPAN_SEALED

    path, writer = written
    writer._db.execute("INSERT INTO records (kind, time, rank, step, name, data) VALUES ('span', ?, 2, 3, "
                       "'forward', '{\"duration_s\": 2.5, \"parent_id\": null}')", (START,))
    writer._db.commit()
    high = writer._db.execute("SELECT max(id) FROM entries").fetchone()[0]
    tested = writer._db.execute(
        "SELECT id, sender, step, rank, coalesce(name, phase, '?'), v0 FROM entries WHERE id > 0 AND id <= ? AND "
        f"{SPAN_SEALED} AND IFNULL(v1, 0) IN (0, '') AND typeof(v0) IN ('integer', 'real') ORDER BY id",
        (high,)).fetchall()
    assert tested == writer._db.execute(span_blocks._SEAL, (0, high, 0, high)).fetchall() and len(tested) > 400
    loose = writer._db.execute(f"SELECT count(*) FROM ({span_blocks._LOOSE_IDS})").fetchone()[0]
    assert loose == 1 + 10  # the JSON span, and rank 1's durations past 2**31
    writer.close()
