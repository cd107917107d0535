"""Memory samples sealed into blocks at ingest (schema 5, ``recorder.blocks``): every reader answers as the rows do.

The store is the real one (SQLite, the writer's own ``write_batch``); the reference answer is the same reader with
the blocks ignored (``blocks.top`` read as 0: every sample row by row, as before schema 5).
"""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from raysleuth.memory import memory_report
from raysleuth.recorder import blocks, reading
from raysleuth.recorder.schema import SCHEMA_VERSION, SEALED
from raysleuth.recorder.store import EvidenceStore
from raysleuth.report import overview
from older_files import UNDO_9, as_schema_9

START = 1_780_000_000.0
MiB = 2**20


def _header(rank: int, job: str = "job-a") -> dict:
    return {"node_id": f"node{rank % 3}", "node_ip": f"10.0.0.{rank % 3}", "pid": 4000 + rank,
            "client_id": f"client-{rank}", "job_id": job, "world_size": 6}


def _sample(rank: int, n: int, *, leak: bool) -> dict:
    rss = 2000 * MiB + (n * 3 * MiB if leak else (n % 5) * MiB)
    cuda = None if rank % 2 else 500 * MiB + n * (MiB if leak else 0)
    return {"rss_bytes": rss, "uss_bytes": rss - 100 * MiB, "cuda_allocated_bytes": cuda,
            "cuda_reserved_bytes": None if cuda is None else cuda + MiB, "cuda_peak_bytes": cuda, "source": "watch"}


def _write(store: EvidenceStore, ranks=range(6), samples: int = 60, *, offset: int = 0, job: str = "job-a") -> None:
    """Six workers, sampled every 5 s, delivered a few samples a batch as clients do; rank 3 leaks, rank 5's first
    ten samples carry no rank yet."""
    for first in range(0, samples, 7):
        for rank in ranks:
            rows = [("memory", START + 5 * n + rank * 0.01, None if rank == 5 and n < 10 else rank, n, None, None,
                     None, _sample(rank, n, leak=rank == 3), offset + n) for n in range(first, min(first + 7, samples))]
            rows.append(("span", START + 5 * first, rank, first, None, "train_step", None, {"duration_s": 0.5},
                         offset + 10_000 + first))
            store.write_batch(_header(rank, job), rows)


def _odd_rows(store: EvidenceStore) -> None:
    """Samples no pass takes: an agent's (JSON, more keys), a string number, a float."""
    agent = {"node_id": "node1", "node_ip": "10.0.0.1", "pid": 4001, "client_id": None, "job_id": "job-a"}
    store.write_batch(agent, [("memory", START + 2 + 5 * n, 1, None, None, None, None,
                               {"rss_bytes": 3000 * MiB, "uss_bytes": 2900 * MiB, "vms_bytes": 9 * 2**30,
                                "source": "agent", "pid": 4001, "node_ip": "10.0.0.1"}, None) for n in range(20)])
    odd = dict(_sample(0, 99, leak=False), rss_bytes="2 GiB")
    store.write_batch(_header(0), [("memory", START + 500, 0, 99, None, None, None, odd, 90_000),
                                   ("memory", START + 501, 0, 100, None, None, None,
                                    dict(_sample(0, 100, leak=False), uss_bytes=1.5e9), 90_001)])


def _rows_only(monkeypatch, read):
    with monkeypatch.context() as patch:
        patch.setattr(blocks, "top", lambda store: 0)
        return read()


def _same_answers(store: EvidenceStore, monkeypatch) -> None:
    for options in ({}, {"rank": [3, 5]}, {"rank": 5}, {"since": START + 120}, {"job": "job-b"}, {"job": "job-a"},
                    {"per_step": False, "fit_quiet": 2}):  # the report's read: no steps, blocks and rows joined
        sealed = memory_report(store, **options).to_dict()
        assert sealed == _rows_only(monkeypatch, lambda: memory_report(store, **options).to_dict()), options
    width = 17.0
    assert list(blocks.rss_buckets(store, width, start=START)) == \
        list(reading.buckets(store, "memory", "rss_bytes", width, start=START))
    for leaking in (set(), {3}):  # the report's curves: from the columns in numpy, and from the rows
        assert overview.memory_curves(store, leaking) == \
            _rows_only(monkeypatch, lambda: overview.memory_curves(store, leaking)), leaking


def _written(tmp_path, monkeypatch, pass_rows: int, samples: int = 60) -> tuple:
    """(the file, its writer) after :func:`_write`, a pass every ``pass_rows`` memory samples."""
    monkeypatch.setattr(blocks, "PASS_ROWS", pass_rows)
    path = tmp_path / "evidence.sqlite"
    writer = EvidenceStore(path)
    _write(writer, samples=samples)
    return path, writer


@pytest.fixture
def store(tmp_path, monkeypatch):
    path, writer = _written(tmp_path, monkeypatch, 50)
    _odd_rows(writer)
    _write(writer, ranks=[0, 4], samples=20, offset=200_000, job="job-b")
    writer.close()
    reader = EvidenceStore(path, readonly=True)
    yield reader
    reader.close()


def test_a_pass_seals_each_sample_once_as_it_was_written(store):
    high = blocks.top(store)
    passes = store._db.execute("SELECT lo, hi FROM block_passes ORDER BY hi").fetchall()
    assert len(passes) >= 5 and passes[-1][1] == high == store._db.execute("SELECT max(id) FROM entries").fetchone()[0]
    assert all(lo == previous for (lo, _), (_, previous) in zip(passes[1:], passes))  # contiguous, from 0
    sealed = {}
    for sender, source, times, ints in blocks.read(store, high):
        assert source == "watch"
        for k in range(len(times)):
            key = int(ints[0][k])
            assert key not in sealed  # no sample twice
            sealed[key] = (sender, float(times[k]),
                           *(None if value == blocks.NULL else int(value) for value in ints[1:, k]))
    rows = store._db.execute(f"SELECT id, sender, time, rank, step, v0, v1, v2, v3, v4 FROM entries WHERE {SEALED}")
    expected = {row[0]: row[1:] for row in rows}
    assert sealed == expected and len(expected) == 6 * 60 + 2 * 20
    loose = store._db.execute(f"SELECT count(*) FROM entries WHERE kind = 'memory' AND NOT ({SEALED})").fetchone()[0]
    assert loose == 22  # the agent's 20 and the two odd samples stay rows alone


def test_every_reader_of_the_samples_answers_as_the_rows_do(store, monkeypatch):
    report = memory_report(store)
    assert [worker.rank for worker in report.leaks] == [3]
    assert next(w for w in report.workers if w.pid == 4005).rank == 5  # its late rank, as the rows say
    _same_answers(store, monkeypatch)


def test_numbers_past_what_a_float_holds_are_told_exactly(tmp_path, monkeypatch):
    """The blocks' numbers are read as floats (exact up to 2**53); the newest sample's, past that, are told as
    written (from its row), as the rows' reader tells them."""
    monkeypatch.setattr(blocks, "PASS_ROWS", 20)
    writer = EvidenceStore(tmp_path / "evidence.sqlite")
    huge = 2**62 + 1  # float(huge) == 2**62
    for n in range(0, 60, 6):
        writer.write_batch(_header(0), [("memory", START + 5 * k, 0, k, None, None, None,
                                         dict(_sample(0, k, leak=False), cuda_reserved_bytes=huge + k), k)
                                        for k in range(n, n + 6)])
    writer.close()
    reader = EvidenceStore(tmp_path / "evidence.sqlite", readonly=True)
    assert blocks.top(reader) == reader._db.execute("SELECT max(id) FROM entries").fetchone()[0]  # all sealed
    for options in ({}, {"per_step": False, "fit_quiet": 16}):  # the table's read, and the report's
        worker, = memory_report(reader, **options).workers
        assert worker.samples == 60 and worker.cuda_reserved_bytes == huge + 59 != int(float(huge + 59))
        assert dataclasses.asdict(worker) == dataclasses.asdict(
            _rows_only(monkeypatch, lambda: memory_report(reader, **options).workers[0]))
    reader.close()


def test_a_clock_set_back_within_a_block_reads_as_the_rows_do(tmp_path, monkeypatch):
    """A worker whose clock went back (its later samples, by id, earlier in time) inside one pass: its block's
    samples are put in (time, id) order, as the rows' reader puts its rows."""
    monkeypatch.setattr(blocks, "PASS_ROWS", 30)
    writer = EvidenceStore(tmp_path / "evidence.sqlite")
    for n in range(0, 40, 4):
        writer.write_batch(_header(1), [("memory", START + 5 * k - (600 if k >= 22 else 0), 1, k, None, None, None,
                                         _sample(1, k if k < 22 else 80 - k, leak=True), k) for k in range(n, n + 4)])
    writer.close()
    reader = EvidenceStore(tmp_path / "evidence.sqlite", readonly=True)
    assert reader._db.execute("SELECT count(*) FROM memory_pass_blocks").fetchone()[0] >= 1
    sealed = memory_report(reader).to_dict()
    assert sealed == _rows_only(monkeypatch, lambda: memory_report(reader).to_dict())
    assert sealed["workers"][0]["series"] != sorted(sealed["workers"][0]["series"])  # the set-back samples first
    reader.close()


def test_a_pass_and_the_readers_find_the_rows_past_the_passes_by_their_ids(store):
    """The rows a pass seals, and those the readers of the blocks still read one by one, are found by id: SQLite
    would otherwise walk the index of every memory row the run holds (a pass's cost growing with the run)."""
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    try:
        memory_report(store)
        list(blocks.rss_buckets(store, 17.0, start=START))
    finally:
        store._db.set_trace_callback(None)
    picked = [sql for sql in statements if sql.startswith("SELECT") and ("id > " in sql or "memory_loose" in sql)]
    assert len(picked) >= 4, statements  # each reader: past the top, and the rows below it no pass took
    for sql in picked + [blocks._SEAL.replace("?", "0")]:
        plan = " ".join(row[3] for row in store._db.execute("EXPLAIN QUERY PLAN " + sql))
        assert "records_kind" not in plan and "PRIMARY KEY" in plan, (sql, plan)


def test_a_pass_reads_what_sealed_admits_off_the_loose_index(tmp_path, monkeypatch):
    """The pass finds the samples ``SEALED`` admits through ``memory_loose`` (the rows it leaves out, tested once when
    written): the same rows as the test on every row, odd ones among them."""
    path, writer = _written(tmp_path, monkeypatch, 10**9, samples=30)  # nothing sealed: every row still there
    _odd_rows(writer)
    high = writer._db.execute("SELECT max(id) FROM entries").fetchone()[0]
    columns = blocks._SEAL.split(" FROM ")[0]
    tested = writer._db.execute(f"{columns} FROM entries WHERE id > 0 AND id <= ? AND {SEALED} ORDER BY id",
                                (high,)).fetchall()
    assert tested == writer._db.execute(blocks._SEAL, (0, high, 0, high)).fetchall() and len(tested) == 6 * 30
    writer._unsealed = 0
    writer.close()


def test_a_row_written_changed_or_removed_below_a_pass_drops_it_and_the_later_ones(tmp_path, monkeypatch):
    path, writer = _written(tmp_path, monkeypatch, 50, samples=100)
    writer.close()
    db = sqlite3.connect(path)

    def in_middle_pass(kind: str) -> int:  # a row of the middle pass of those left
        passes = db.execute("SELECT lo, hi FROM block_passes ORDER BY hi").fetchall()
        return db.execute("SELECT id FROM entries WHERE kind = ? AND id > ? AND id <= ? ORDER BY id LIMIT 1",
                          (kind, *passes[len(passes) // 2])).fetchone()[0]

    def update() -> int:
        row = in_middle_pass("memory")
        db.execute("UPDATE records SET data = ? WHERE id = ?", (f'{{"rss_bytes": {9000 * MiB}}}', row))
        return row

    def delete() -> int:
        row = in_middle_pass("memory")
        db.execute("DELETE FROM records WHERE id = ?", (row,))
        return row

    def insert() -> int:  # into a span's place below the top
        row = in_middle_pass("span")
        top = db.execute("SELECT max(hi) FROM block_passes").fetchone()[0]
        db.execute("DELETE FROM entries WHERE id = ?", (row,))
        assert db.execute("SELECT max(hi) FROM block_passes").fetchone()[0] < row  # a span's pass goes too (schema 7)
        db.commit()
        blocks.seal(db)  # sealed again, the span's place empty below the top
        assert db.execute("SELECT max(hi) FROM block_passes").fetchone()[0] >= top
        db.execute("INSERT INTO records (id, kind, time, rank, step, data, node_ip, pid, client_id, job_id, world_size,"
                   " node_id) VALUES (?, 'memory', ?, 3, 7, ?, '10.0.0.0', 4003, 'client-3', 'job-a', 6, 'node0')",
                   (row, START + 7, '{"rss_bytes": 1}'))
        return row

    for edit in (update, delete, insert):
        before = db.execute("SELECT max(hi) FROM block_passes").fetchone()[0]
        edited = edit()
        db.commit()
        after = db.execute("SELECT coalesce(max(hi), 0) FROM block_passes").fetchone()[0]
        assert after < edited <= before, (edit.__name__, before, after)  # its pass went, and every later one
        assert db.execute("SELECT count(*) FROM memory_blocks WHERE pass > ?", (after,)).fetchone()[0] == 0
        reader = EvidenceStore(path, readonly=True)
        _same_answers(reader, monkeypatch)
        reader.close()
    db.close()
    writer = EvidenceStore(path)  # the next pass seals again what the dropped ones held
    _write(writer, ranks=[1], samples=60, offset=300_000)
    writer.close()
    reader = EvidenceStore(path, readonly=True)
    assert blocks.top(reader) == reader._db.execute("SELECT max(id) FROM entries").fetchone()[0]
    _same_answers(reader, monkeypatch)
    reader.close()


def test_a_pass_that_fails_never_fails_the_write(tmp_path, monkeypatch):
    def broken(db):
        db.execute("BEGIN IMMEDIATE")
        db.rollback()
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(blocks, "seal", broken)
    path, writer = _written(tmp_path, monkeypatch, 10, samples=30)
    assert writer.count("memory") == 6 * 30
    writer.close()
    reader = EvidenceStore(path, readonly=True)
    assert blocks.top(reader) == 0 and memory_report(reader).workers  # read row by row, as before schema 5
    reader.close()


def test_a_snapshot_reads_one_state_while_the_writer_seals(tmp_path, monkeypatch):
    path, writer = _written(tmp_path, monkeypatch, 10**9, samples=20)  # passes only when asked
    blocks.seal(writer._db)
    reader = EvidenceStore(path, readonly=True)
    _write(writer, samples=20, offset=1000)
    with blocks.snapshot(reader):
        high = blocks.top(reader)
        blocks.seal(writer._db)  # committed while the reader reads
        assert blocks.top(reader) == high
        assert sum(len(times) for _, _, times, _ in blocks.read(reader, high)) == 6 * 20
    assert blocks.top(reader) > high
    writer.close()
    reader.close()


def test_a_version_4_file_reads_as_rows_and_is_sealed_once_a_writer_opens_it(tmp_path, monkeypatch):
    path, writer = _written(tmp_path, monkeypatch, 10**9, samples=30)  # nothing sealed until close
    writer._unsealed = 0  # closed unsealed, then made a version 4 file: what migration 5 added, removed
    writer.close()
    db = sqlite3.connect(path)
    as_schema_9(db)  # each pass's block of every sender as schema 9 wrote it
    for statement in (*UNDO_9, "DROP INDEX log_severe", "DROP TRIGGER span_blocks_insert",
                      "DROP TRIGGER span_blocks_update",
                      "DROP TRIGGER span_blocks_delete", "DROP INDEX span_loose", "DROP TABLE span_blocks",
                      "DROP TRIGGER memory_blocks_insert", "DROP TRIGGER memory_blocks_update",
                      "DROP TRIGGER memory_blocks_delete", "DROP INDEX memory_loose", "DROP TABLE memory_blocks",
                      "DROP TABLE block_passes", "DROP TRIGGER collective_entries_insert",
                      "DROP TRIGGER collective_entries_update", "DROP TRIGGER collective_entries_delete",
                      "DROP TABLE collective_entries", "PRAGMA user_version=4"):
        db.execute(statement)
    db.commit()
    db.close()
    old = EvidenceStore(path, readonly=True)
    assert old.schema_version == 4 and blocks.top(old) == 0
    by_rows = memory_report(old).to_dict()
    old.close()
    writer = EvidenceStore(path)  # migrates to 5 (and on); its first pass seals the old samples with the new
    _write(writer, ranks=[2], samples=10, offset=5000)
    writer.close()
    reader = EvidenceStore(path, readonly=True)
    assert reader.schema_version == SCHEMA_VERSION and blocks.top(reader)
    assert sum(len(times) for _, _, times, _ in blocks.read(reader, blocks.top(reader))) == 6 * 30 + 10
    _same_answers(reader, monkeypatch)
    assert [w for w in memory_report(reader).to_dict()["workers"] if w["pid"] != 4002] == \
        [w for w in by_rows["workers"] if w["pid"] != 4002]  # the others' answers, as the version 4 file's
    reader.close()
