"""A collectives dump's entries taken out once at ingest (``recorder.compact``, schema 6): readers answer
exactly as they do parsing every dump, on real store files written through the store's write path."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from raysleuth.collectives import match
from raysleuth.collectives import report as collectives_report
from raysleuth.collectives.model import ENTRIES_PER_GROUP, positions_from_dumps
from raysleuth.collectives.report import _read_dumps, stored_verdict
from raysleuth.recorder import compact
from raysleuth.recorder.reading import newest_per_worker
from raysleuth.recorder.store import COLUMNS, EvidenceStore
from older_files import UNDO_9, as_schema_9

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from _synthetic import START, identity, rank_rows  # noqa: E402


def _odd_dumps() -> list[dict]:
    """Dumps no synthetic rank writes: more calls than a reader keeps, items that are not objects, a NaN, an int
    past 64 bits, a lone surrogate, a NaN time, arrays that are not arrays, a Flight Recorder that is a list."""
    calls = [{"pg": str(n % 2), "seq": n, "op": "all_reduce", "state": "completed", "start_ns": 10**9 * n,
              "end_ns": 10**9 * n + 5, "file": "train.py", "line": 61, "note": "é\ud800"} if n % 40 else n
             for n in range(1, 300)]
    groups = {"0": {"desc": "default_pg"}, "1": {"desc": "dp"}}
    return [
        {"rank": 0, "world_size": 2, "job_id": "01000000", "groups": groups, "calls": calls,
         "flight_recorder": None, "time": START + 1},
        {"rank": 1, "world_size": 2, "job_id": "01000000", "groups": groups,
         "calls": calls[:-3] + [{"pg": "0", "seq": 299, "op": "broadcast", "state": "started", "step": float("nan"),
                                 "start_ns": 299 * 10**9, "input": [[[2**70], "float32"]]},
                                {"pg": "1", "seq": 300, "op": "barrier", "state": "started", "start_ns": float("nan")}],
         "flight_recorder": {"entries": [1, {"collective_seq_id": 5, "process_group": ["0"],
                                             "profiling_name": "gloo:all_reduce", "time_created_ns": 5 * 10**9,
                                             "input_sizes": [[4]], "input_dtypes": ["Float"]}],
                             "pg_status": {"0": {"last_completed_collective": 4}}}},
        {"rank": 2, "groups": [], "calls": {"0": []}, "flight_recorder": {"entries": {"0": 1}}},
        {"rank": 3, "groups": {}, "calls": calls[:5], "flight_recorder": [1, 2]},
    ]


def _write(path: Path) -> EvidenceStore:
    store = EvidenceStore(path)
    for rank in range(6):
        rows = [row for row in rank_rows(rank, world=6, minutes=2, mode="full" if rank % 2 else "light", culprit=3,
                                         leaker=9, straggler=9) if row[0] == "collectives"]
        store.write_batch(identity(rank, 6), [row + (n,) for n, row in enumerate(rows)])
    store.write_batch({"client_id": "odd", "pid": 9_000, "job_id": "01000000"},
                      [("collectives", START + 200 + k, dump.get("rank"), None, None, "request", "INFO", dump, k)
                       for k, dump in enumerate(_odd_dumps())])
    store._db.execute("INSERT INTO records (kind, time, rank, pid, data) VALUES ('collectives', ?, 4, 77, '{bad')",
                      (START + 300,))
    store._db.execute("INSERT INTO records (kind, time, rank, pid, data) VALUES ('collectives', ?, 5, 78, '[1]')",
                      (START + 301,))
    store._db.commit()
    store.write_batch(identity(5, 6), [("collectives", START + 302, 5, None, None, "exit", "INFO",
                                        {"rank": 5, "calls": [], "flight_recorder": None}, 99)])
    return store


def _as_parsed(store, monkeypatch) -> tuple:
    """What the readers answer parsing every dump (no stored entries taken)."""
    with monkeypatch.context() as patch:
        patch.setattr(compact, "read", lambda *args, **kwargs: {})
        taken: dict = {}
        records, dumps = _read_dumps(store, None, taken)
        return records, dumps, taken, stored_verdict(store)


def _same(records, dumps, taken, other) -> None:
    """The same records in the same order, the same dumps and the same entries per dump (NaN as JSON says it)."""
    dump = lambda value: json.dumps(value, default=repr, sort_keys=False)  # noqa: E731
    assert dump(records) == dump(other[0])
    assert dump([d.to_record_dict() for d in dumps]) == dump([d.to_record_dict() for d in other[1]])
    assert [repr(taken[id(d)]) for d in dumps] == [repr(other[2][id(d)]) for d in other[1]]


@pytest.fixture(autouse=True)
def every_batch_a_pass(monkeypatch):
    """A pass after every batch (a writer makes one at most every ``PASS_SECONDS``: tested on its own below)."""
    monkeypatch.setattr(compact, "PASS_SECONDS", 0.0)


def test_each_dumps_entries_are_taken_once_and_read_as_the_parsed_dump_gives_them(tmp_path, monkeypatch):
    writer = _write(tmp_path / "evidence.sqlite")
    stored = dict(writer._db.execute("SELECT id, body IS NOT NULL FROM collective_entries"))
    dumps = [row[0] for row in writer._db.execute("SELECT id FROM entries WHERE kind = 'collectives'")]
    assert sorted(stored) == sorted(dumps)  # every dump passed; of each worker's in a pass, the newest taken
    foreign = {row[0] for row in writer._db.execute("SELECT id FROM entries WHERE kind = 'collectives' AND "
                                                    "data IN ('{bad', '[1]')")}
    assert {i for i in newest_per_worker(writer, "collectives") if not stored[i]} == foreign
    assert sum(stored.values()) == 6 + 4 + 1  # a rank's batch: its newest; the odd ones: four ranks; the exit
    writer.close()
    reader = EvidenceStore(tmp_path / "evidence.sqlite", readonly=True)
    parsed = _as_parsed(reader, monkeypatch)
    calls = []
    real = collectives_report.entries_from_dump
    monkeypatch.setattr(collectives_report, "entries_from_dump", lambda data: calls.append(1) or real(data))
    taken: dict = {}
    records, read = _read_dumps(reader, None, taken)
    assert len(read) >= 8 and len(calls) == 2  # of the newest dumps, only '{bad' and '[1]' are parsed
    _same(records, read, taken, parsed)
    verdict = stored_verdict(reader)
    assert verdict.to_dict() == parsed[3].to_dict() and verdict.culprits
    assert match(positions_from_dumps(read, taken=taken)).to_dict() == verdict.to_dict()
    reader.close()


def test_a_dump_changed_or_removed_drops_its_entries_and_is_read_as_it_now_is(tmp_path, monkeypatch):
    writer = _write(tmp_path / "evidence.sqlite")
    newest = writer._db.execute("SELECT max(id) FROM entries WHERE kind = 'collectives' AND rank = 1").fetchone()[0]
    assert writer._db.execute("SELECT count(*) FROM collective_entries WHERE id = ?", (newest,)).fetchone()[0] == 1
    writer._db.execute("UPDATE records SET data = ? WHERE id = ?",
                       (json.dumps({"rank": 1, "groups": {"0": {}}, "calls": [
                           {"pg": "0", "seq": 1, "op": "barrier", "state": "started", "start_ns": 1}]}), newest))
    writer._db.execute("DELETE FROM records WHERE id = (SELECT max(id) FROM entries WHERE kind = 'collectives' "
                       "AND rank = 2)")
    writer._db.commit()
    assert writer._db.execute("SELECT count(*) FROM collective_entries WHERE id = ?", (newest,)).fetchone()[0] == 0
    assert writer._db.execute("SELECT count(*) FROM collective_entries c WHERE NOT EXISTS "
                              "(SELECT 1 FROM entries e WHERE e.id = c.id)").fetchone()[0] == 0
    taken: dict = {}
    records, dumps = _read_dumps(writer, None, taken)
    changed = next(d for d in dumps if d.row.id == newest)
    assert [(e.op, e.state) for e in taken[id(changed)]["0"].values()] == [("barrier", "pending")]
    _same(records, dumps, taken, _as_parsed(writer, monkeypatch))
    writer.close()


def test_entries_of_another_format_or_cut_and_files_before_schema_6_are_parsed(tmp_path, monkeypatch):
    writer = _write(tmp_path / "evidence.sqlite")
    parsed = _as_parsed(writer, monkeypatch)
    writer._db.execute("UPDATE collective_entries SET format = format + 1 WHERE id % 2 = 0")
    writer._db.execute("UPDATE collective_entries SET keep = ? WHERE id % 3 = 0", (ENTRIES_PER_GROUP + 1,))
    writer._db.commit()
    taken: dict = {}
    records, dumps = _read_dumps(writer, None, taken)
    _same(records, dumps, taken, parsed)
    writer.close()
    db = sqlite3.connect(tmp_path / "evidence.sqlite")
    as_schema_9(db)  # each pass's block of every sender as schema 9 wrote it
    for statement in (*UNDO_9, "DROP INDEX log_severe", "DROP TRIGGER collective_entries_insert",
                      "DROP TRIGGER collective_entries_update",
                      "DROP TRIGGER collective_entries_delete", "DROP TABLE collective_entries",
                      "PRAGMA user_version=5"):
        db.execute(statement)
    db.commit()
    db.close()
    old = EvidenceStore(tmp_path / "evidence.sqlite", readonly=True)
    assert old.schema_version == 5 and compact.read(old, [1, 2], COLUMNS) == {}
    taken = {}
    records, dumps = _read_dumps(old, None, taken)
    _same(records, dumps, taken, parsed)
    old.close()


def test_a_dump_the_pass_cannot_take_is_parsed_and_the_next_ones_are_still_taken(tmp_path, monkeypatch):
    real = compact.body
    monkeypatch.setattr(compact, "body", lambda text, keep=ENTRIES_PER_GROUP: (
        real(text, keep) if '"rank":2' not in text else 1 / 0))
    writer = _write(tmp_path / "evidence.sqlite")
    empty = {row[0] for row in writer._db.execute("SELECT id FROM collective_entries WHERE body IS NULL")}
    ranks = {row[0] for row in writer._db.execute(
        f"SELECT rank FROM entries WHERE id IN ({','.join(map(str, empty))})")}
    assert 2 in ranks and writer._db.execute("SELECT max(id) FROM collective_entries").fetchone()[0] == \
        writer._db.execute("SELECT max(id) FROM entries WHERE kind = 'collectives'").fetchone()[0]
    taken: dict = {}
    records, dumps = _read_dumps(writer, None, taken)
    _same(records, dumps, taken, _as_parsed(writer, monkeypatch))
    writer.close()


def test_a_pass_reads_at_most_its_share_and_the_next_ones_read_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(compact, "PASS_DUMPS", 5)
    store = EvidenceStore(tmp_path / "evidence.sqlite")
    store._db.executemany("INSERT INTO records (kind, time, rank, pid, data) VALUES ('collectives', ?, ?, ?, ?)",
                          [(START + n, n, n, json.dumps({"rank": n, "calls": []})) for n in range(8)])
    store._db.commit()  # an older raysleuth's dumps: no pass took them
    assert store._db.execute("SELECT count(*) FROM collective_entries").fetchone()[0] == 0
    for seq in range(2):
        store.write_batch(identity(0, 1), [("collectives", START + 10 + seq, 0, None, None, "exit", "INFO",
                                            {"rank": 0, "calls": []}, seq)])
    # the first pass read five old dumps; the second the other three, and rank 0's two (its newest taken)
    assert store._db.execute("SELECT count(*), count(body) FROM collective_entries").fetchone() == (10, 9)
    store.close()


def test_a_writer_passes_at_most_every_few_seconds_and_at_close(tmp_path, monkeypatch):
    """Between passes a worker's dumps wait (a reader parses them); a pass takes each worker's newest only; the
    store's close takes what waits."""
    monkeypatch.setattr(compact, "PASS_SECONDS", 3600.0)
    path = tmp_path / "evidence.sqlite"
    store = EvidenceStore(path)
    for seq in range(4):  # the first batch passes (none before it); the others wait
        store.write_batch(identity(seq % 2, 2), [("collectives", START + seq, seq % 2, None, None, "periodic",
                                                  "INFO", {"rank": seq % 2, "calls": [], "seq": seq}, seq)])
    assert [row[0] for row in store._db.execute("SELECT id FROM collective_entries")] == [1]
    store.close()
    reader = EvidenceStore(path, readonly=True)
    assert dict(reader._db.execute("SELECT id, body IS NOT NULL FROM collective_entries")) == \
        {1: True, 2: False, 3: True, 4: True}  # rank 1's older dump (2) is no reader's: marked, not taken
    assert sorted(compact.read(reader, newest_per_worker(reader, "collectives"), COLUMNS)) == [3, 4]
    reader.close()
