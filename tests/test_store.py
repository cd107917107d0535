"""The evidence database on its own: schema, writes, reads, corruption."""

import json
import sqlite3
import time

import pytest

from raysleuth.errors import StoreCorrupt, StoreNotFound
from raysleuth.recorder import reading
from raysleuth.recorder.store import SCHEMA_VERSION, EvidenceStore, latest_run, open_run, resolve_store_path


def _rows(n, client="c1", start=0):
    return [("log", time.time(), i % 4, i, "train", "app", "INFO", {"i": i, "msg": f"m{i}"}, start + i) for i in range(n)]


def test_round_trip_and_filters(tmp_path):
    store = open_run(tmp_path, "run-a")
    header = {"client_id": "c1", "pid": 42, "node_ip": "10.0.0.1", "actor_name": "trainer_rank1"}
    assert store.write_batch(header, _rows(100)) == 100
    reader = EvidenceStore(store.path, readonly=True)
    assert reader.schema_version == SCHEMA_VERSION
    assert reader.count("log") == 100
    rank2 = reader.query("log", rank=2)
    assert len(rank2) == 25 and all(r.rank == 2 for r in rank2)
    assert rank2[0].pid == 42 and rank2[0].node_ip == "10.0.0.1" and rank2[0].data["msg"].startswith("m")
    assert [r.step for r in reader.query("log", step_min=10, step_max=12)] == [10, 11, 12]
    newest = reader.query("log", limit=1, newest_first=True)[0]
    assert newest.data["i"] == 99
    assert reader.kinds() == {"log": 100}


def test_redelivery_is_idempotent(tmp_path):
    store = open_run(tmp_path, "run-b")
    header = {"client_id": "c1"}
    assert store.write_batch(header, _rows(10)) == 10
    assert store.write_batch(header, _rows(10)) == 0  # same client, same seq: already stored
    assert store.write_batch({"client_id": "c2"}, _rows(10)) == 10
    assert store.count() == 20


def test_latest_run_and_resolution(tmp_path):
    with pytest.raises(StoreNotFound) as error:
        resolve_store_path(tmp_path)
    assert str(tmp_path) in str(error.value)
    open_run(tmp_path, "one").add("doctor", {"ok": True})
    open_run(tmp_path, "two").add("doctor", {"ok": False})
    assert latest_run(tmp_path) == "two"
    assert resolve_store_path(tmp_path, "one").parent.name == "one"
    with pytest.raises(StoreNotFound) as error:
        resolve_store_path(tmp_path, "three")
    assert "one" in str(error.value) and "two" in str(error.value)


def test_corrupt_file_is_store_corrupt_with_path(tmp_path):
    path = tmp_path / "runs" / "bad" / "evidence.sqlite"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreCorrupt) as error:
        EvidenceStore(path, readonly=True).query("log")
    assert str(path) in str(error.value)
    with pytest.raises(StoreCorrupt):
        EvidenceStore(path)


def test_newer_schema_is_refused(tmp_path):
    store = open_run(tmp_path, "future")
    store._db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    store._db.commit()
    with pytest.raises(StoreCorrupt) as error:
        EvidenceStore(store.path, readonly=True)
    assert "newer" in str(error.value)


def test_wal_mode(tmp_path):
    store = open_run(tmp_path, "wal")
    mode = sqlite3.connect(store.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def _identity(rank: int) -> dict:
    """A batch header as a Ray rank's client sends it (what every row carried in a version 2 file)."""
    return {"world_size": 64, "node_id": f"{rank // 8:056x}", "node_ip": f"10.0.0.{rank // 8 + 1}",
            "hostname": f"gpu-node-{rank // 8:04d}", "pid": 20_000 + rank, "actor_id": f"{rank:032x}",
            "actor_name": f"TrainWorker_rank{rank}", "actor_class": "TrainWorker", "client_id": f"client{rank:08d}",
            "job_id": "01000000"}


def _version_2_file(path, rows_per_rank: int) -> list[tuple]:
    """A store written by raysleuth before version 3: every identity column in every row."""
    from raysleuth.recorder.store import COLUMNS, MIGRATIONS
    from raysleuth.recorder.schema import statements

    db = sqlite3.connect(path)
    for number in range(2):
        for statement in statements(MIGRATIONS[number]):
            db.execute(statement)
    db.execute("PRAGMA user_version=2")
    written = []
    for rank in range(8):
        header = _identity(rank)
        for n in range(rows_per_rank):
            row = ("heartbeat", 1000.0 + n, rank, n, None, None, None, '{"step":%d}' % n, n)
            written.append(row + tuple(header[c] for c in COLUMNS[9:]))
    written.append(("event", 5.0, None, None, None, "x", None, "{not json", None) + (None,) * 10)  # a foreign row
    db.executemany(f"INSERT INTO records ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})", written)
    db.commit()
    db.close()
    return written


def test_a_version_2_file_is_migrated_with_every_record_its_identity_and_its_deliveries(tmp_path):
    """Version 3 keeps each sender's identity once: a writer opening an older run's file moves every record
    over (its id, its columns, its sender's), and a batch it had already stored is still stored once."""
    from raysleuth.recorder.store import COLUMNS

    path = tmp_path / "evidence.sqlite"
    written = _version_2_file(path, 50)
    old = EvidenceStore(path, readonly=True)
    before = [(r.id, *(getattr(r, c) for c in COLUMNS if c != "data")) for r in old.query()]
    assert old.schema_version == 2 and len(before) == len(written)
    old.close()
    store = EvidenceStore(path)
    assert store.schema_version == SCHEMA_VERSION == 10
    assert [(r.id, *(getattr(r, c) for c in COLUMNS if c != "data")) for r in store.query()] == before
    assert store.query("event")[0].data == {"raw": "{not json"}
    assert store._db.execute("SELECT COUNT(*) FROM senders").fetchone()[0] == 9  # 8 ranks and the foreign row
    assert store.write_batch(_identity(3), [("heartbeat", 1000.0, 3, 0, None, None, None, {"step": 0}, 0)]) == 0
    assert store.write_batch(_identity(3), [("heartbeat", 2000.0, 3, 50, None, None, None, {"step": 50}, 50)]) == 1
    assert store.query("heartbeat", job="01000000", rank=3)[-1].actor_name == "TrainWorker_rank3"
    assert store.jobs() == {"01000000": 401} and store.ranks() == list(range(8))
    # the view takes what a table took: a raw insert, an update, a delete
    store._db.execute("INSERT INTO records (kind, time, rank, data, pid) VALUES ('memory', 9.0, 3, '{}', 77)")
    store._db.execute("UPDATE records SET data = '{\"a\": 1}' WHERE kind = 'memory'")
    assert [(r.pid, r.data) for r in store.query("memory")] == [(77, {"a": 1})]
    store._db.execute("DELETE FROM records WHERE kind = 'memory'")
    assert store.query("memory") == [] and store.count() == len(written) + 1
    store.close()


def test_a_header_that_changes_between_two_sends_of_a_batch_still_stores_it_once(tmp_path):
    """A client's identity can grow between a lost acknowledgement and the resend (its rank learned, a job id
    set): the delivery key is the client and the sequence number, whatever sender the header now names."""
    store = open_run(tmp_path, "run-h")
    header = {"client_id": "c9", "pid": 9}
    assert store.write_batch(header, _rows(3)) == 3
    assert store.write_batch({**header, "world_size": 4, "job_id": "02000000"}, _rows(4)) == 1
    assert [r.world_size for r in store.query("log")] == [None, None, None, 4]


def test_each_senders_identity_is_stored_once_not_in_every_row(tmp_path):
    """The same records take a fraction of the bytes: 8 ranks x 2,000 heartbeats with their identities."""
    old_path, new_path = tmp_path / "v2.sqlite", tmp_path / "v3.sqlite"
    written = _version_2_file(old_path, 2000)
    store = EvidenceStore(new_path)
    for rank in range(8):
        rows = [r[:9] for r in written if r[2] == rank]
        assert store.write_batch(_identity(rank), [(*r[:7], {"step": r[3]}, r[8]) for r in rows]) == 2000
    store._db.execute("VACUUM")
    store.close()
    old_size, new_size = old_path.stat().st_size, new_path.stat().st_size
    assert new_size < 0.45 * old_size, (old_size, new_size)


def test_a_read_of_the_rows_own_columns_answers_as_the_view_and_names_its_sender(tmp_path):
    """No identity column: read from the rows' table (no join), with the same rows, fields and job filter as
    through the view; ``sender`` is readable there alone."""
    from raysleuth.errors import UsageError

    store = open_run(tmp_path, "run-own")
    for job, pid in (("01000000", 7), ("02000000", 8)):
        header = {"client_id": f"c{pid}", "pid": pid, "job_id": job}
        rows = [("memory", 100.0 + i, i % 2, i, None, None, None,
                 {"rss_bytes": 10 * i, "uss_bytes": i, "cuda_allocated_bytes": None, "cuda_reserved_bytes": None,
                  "cuda_peak_bytes": None, "source": "watch"} if i % 3 else {"rss_bytes": 5, "pid": 99}, i)
                for i in range(12)]
        assert store.write_batch(header, rows) == 12
    fields = ("rss_bytes", "uss_bytes", "pid", "source")
    for job in (None, "02000000", ["01000000", "02000000"], "03000000"):
        own = list(store.select("memory", ("time", "rank", "sender"), fields, order="rank", job=job))
        viewed = list(store.select("memory", ("time", "rank", "pid"), fields, order="rank", job=job))
        assert [r[:2] + r[3:] for r in own] == [r[:2] + r[3:] for r in viewed], job
        senders = dict(store._db.execute("SELECT id, pid FROM senders"))
        assert [senders[r[2]] for r in own] == [r[2] for r in viewed]
    assert len(viewed) == 0 and len(own) == 0
    assert {r[5] for r in store.select("memory", ("time", "rank", "pid"), fields, job="01000000")} == {None, 99}
    with pytest.raises(UsageError, match="sender"):
        list(store.select("memory", ("sender", "pid")))
    # ``stored`` and the value columns, as the rows hold them: a packed sample's numbers there and its data '',
    # any other sample's data its JSON; ``senders`` gives each sender's identity by its number
    stored = list(store.select("memory", ("sender", "stored", "v0", "v1"), order="id"))
    packed = [row for row in stored if row[1] == ""]
    assert len(packed) == 16 and all(row[2] is not None for row in packed)
    assert all(json.loads(row[1]) == {"rss_bytes": 5, "pid": 99} and row[2] is None for row in stored
               if row[1] != "")
    identities = reading.senders(store, ("pid", "job_id"))
    assert sorted(identities.values()) == [(7, "01000000"), (8, "02000000")]
    assert {identities[row[0]][0] for row in stored} == {7, 8}
    with pytest.raises(UsageError, match="stored"):
        list(store.select("memory", ("stored", "pid")))


def test_a_spans_numbers_are_read_from_their_kept_copy_as_from_their_json(tmp_path):
    """A span's duration, parent, start, end and id are also kept in value columns (``schema.COPIED``) and read
    there in SQL: every reader answers as from the JSON, for rows with the copy, rows without it (written
    through the ``records`` view, as by an older raysleuth), rows whose values cannot be kept (NaN, a bool, a
    dict) and a row changed through the view afterwards."""
    from raysleuth.recorder.totals import span_totals

    store = open_run(tmp_path, "run-spans")
    spans = [{"start": 10.0 + i, "end": 10.25 + i, "duration_s": 0.25 + i / 7, "span_id": i, "parent_id": None}
             for i in range(6)]
    spans[1]["parent_id"] = 0  # top-level all the same
    spans[2]["parent_id"] = 1  # nested: not in the totals
    spans[3]["duration_s"] = float("nan")  # no copy: its JSON is not valid, it reads as no number
    spans[4]["parent_id"] = {"odd": True}  # no copy
    spans[5]["duration_s"] = True  # no copy (a bool is not a number to keep)
    rows = [("span", 100.0 + i, i % 2, 1, None, "forward", None, data, i) for i, data in enumerate(spans)]
    assert store.write_batch({"client_id": "c1", "pid": 7}, rows) == 6
    store._db.execute("INSERT INTO records (kind, time, rank, step, name, data) VALUES ('span', 200.0, 1, 1, "
                      "'forward', '{\"duration_s\": 2.5, \"parent_id\": null, \"start\": 1.5, \"span_id\": 9}')")
    marks = [row[0] for row in store._db.execute("SELECT v5 FROM entries WHERE kind = 'span' ORDER BY id")]
    assert marks == [1, 1, 1, None, None, None, None], marks  # kept where each value could be; not via the view
    fields = ("duration_s", "duration_s:number", "parent_id", "start", "end", "span_id", "parent_id:json")
    read = list(store.select("span", ("time", "rank"), fields, order="time"))
    store._db.execute("UPDATE entries SET v0 = NULL, v1 = NULL, v2 = NULL, v3 = NULL, v4 = NULL, v5 = NULL")
    assert read == list(store.select("span", ("time", "rank"), fields, order="time"))  # the JSON's answer
    assert read[0][2] == spans[0]["duration_s"] and read[2][4] == 1 and read[6][2] == 2.5
    store._db.execute("DELETE FROM entries WHERE kind = 'span'")
    assert store.write_batch({"client_id": "c1", "pid": 7}, [(*row[:8], row[8] + 10) for row in rows]) == 6
    totals = sorted(span_totals(store))
    assert totals == [(1, 0, "forward", spans[0]["duration_s"]), (1, 1, "forward", spans[1]["duration_s"])], totals
    store._db.execute("UPDATE records SET data = '{\"duration_s\": 4.0}' WHERE time = 100.0")  # the copy goes too
    assert sorted(span_totals(store))[0] == (1, 0, "forward", 4.0)


def test_span_totals_summed_in_numpy_are_sqls_sums(tmp_path):
    """``totals.span_columns`` (the spans handed over unsorted, sorted and summed in numpy) answers what SQL's
    GROUP BY answers (``span_totals``): repeated keys, whole numbers, names and phases, nested spans, no duration,
    no rank or step, a row without its kept copy, a job filter; and hands the question back (None) when a step
    is not a number."""
    from raysleuth.recorder.totals import span_columns, span_rows, span_totals
    
    store = open_run(tmp_path, "run-span-columns")

    def span(duration, parent=None):
        return {"start": 1.0, "end": 2.0, "duration_s": duration, "span_id": 1, "parent_id": parent}

    rows = [("span", 10.0, 0, 1, None, "forward", None, span(0.5), 0),
            ("span", 11.0, 0, 1, None, "forward", None, span(0.25), 1),  # forward thrice in step 1: summed
            ("span", 12.0, 0, 1, None, "forward", None, span(0.125), 2),
            ("span", 13.0, 0, 1, "backward", None, None, span(2), 3),  # a phase, no name; an int
            ("span", 14.0, 0, 1, "backward", None, None, span(3), 4),  # ints summed as ints
            ("span", 15.0, 0, 2, None, "forward", None, span(1), 5),
            ("span", 16.0, 0, 2, None, "forward", None, span(0.75), 6),  # an int and a float
            ("span", 17.0, 0, 2, None, "inner", None, span(9.0, parent=3), 7),  # nested: not a total
            ("span", 18.0, 0, 2, None, "idle", None, span(None), 8),  # no duration: no total
            ("span", 19.0, None, 2, None, "forward", None, span(1.0), 9),  # no rank
            ("span", 20.0, 1, None, None, "forward", None, span(1.0), 10),  # no step
            ("span", 21.0, 1, 2, None, None, None, span(0.5, parent=0), 11),  # neither: '?'; parent 0 is top-level
            ("span", 22.0, 1, 1, None, "forward", None, span(1 / 3), 12)]
    store.write_batch({"client_id": "c1", "pid": 7, "job_id": "job-a"}, rows)
    store.write_batch({"client_id": "c2", "pid": 8, "job_id": "job-b"},
                      [("span", 23.0, 1, 1, None, "forward", None, span(0.1), 0)])
    store._db.execute("INSERT INTO records (kind, time, rank, step, name, data) VALUES ('span', 24.0, 1, 1, "
                      "'forward', '{\"duration_s\": 2.5, \"parent_id\": null}')")  # no kept copy
    store._db.commit()
    expected = list(span_totals(store))
    assert (1, 0, "forward", 0.875) in expected and (1, 0, "backward", 5) in expected
    for job in (None, ["job-a"], ["job-b"]):
        columns = span_columns(store, job=job)
        assert columns is not None and span_rows(columns) == list(span_totals(store, job=job)), job
    store._db.execute("INSERT INTO records (kind, time, rank, step, name, data) VALUES ('span', 25.0, 1, 'two', "
                      "'forward', '{\"duration_s\": 1.0}')")
    assert span_columns(store) is None  # a step that is not a number: SQL's answer, row by row


def test_the_writers_ranks_and_identities_found_by_index_are_those_every_row_holds(tmp_path):
    """``counting.writers`` (ranks an index seek each, identities from ``senders``) finds the ranks, nodes and actor
    classes one scan of every row finds: ranks of every kind, none, a text one; identities without a rank."""
    from raysleuth.recorder.counting import writers

    store = open_run(tmp_path, "run-writers")
    for rank in range(40):
        header = {"client_id": f"c{rank}", "pid": 100 + rank, "node_ip": f"10.0.0.{rank % 5}",
                  "hostname": f"host{rank % 5}", "actor_class": "Trainer" if rank % 2 else "Rollout"}
        kind = ("log", "memory", "span")[rank % 3]
        store.write_batch(header, [(kind, 10.0 + n, rank if n else None, n, None, None, "INFO", {"n": n}, n)
                                   for n in range(3)])
    store.write_batch({"client_id": "agent", "node_ip": "10.0.0.9", "actor_class": None},
                      [("event", 50.0, None, None, None, "up", "INFO", {}, 0)])
    store._db.execute("INSERT INTO records (kind, time, rank, data) VALUES ('log', 60.0, 'seven', '{}')")
    store._db.commit()
    every = list(store._db.execute("SELECT DISTINCT rank, node_ip, hostname, actor_class FROM records"))
    found = writers(store, store.kinds())
    for column in range(4):
        assert {row[column] for row in found} - {None} == {row[column] for row in every} - {None}, column
    assert len({row[0] for row in found} - {None}) == 41


def test_a_stored_json_value_reads_as_json_loads_reads_it():
    """``reading.loads`` parses with orjson and reads what orjson refuses with ``json``: the same values."""
    import math

    texts = ['{"a": [1, 2.5, "x", null, true, {"b": -3}]}', '[1e308, -0.0, 1.5e-7]', '"\\u00e9\\ud83d\\ude00"',
             '{"a": NaN, "b": Infinity, "c": -Infinity}', '{"big": 123456789012345678901234567890}',
             '{"dup": 1, "dup": 2}', '  {"spaced" :  1 }  ', '[18446744073709551615, 18446744073709551616]',
             '[-9223372036854775808, -9223372036854775809]', '{"t": 1780000000123456789, "s": "12345678901234567890"}',
             '[1' + '0' * 400 + ']', '"\\ud800"']
    for text in texts:
        got, expected = reading.loads(text), json.loads(text)
        assert json.dumps(got) == json.dumps(expected) and type(got) is type(expected), text
    assert math.isnan(reading.loads('{"a": NaN}')["a"])
    assert reading.loads("{bad json", "default") == "default" and reading.loads(None, 7) == 7
