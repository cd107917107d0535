"""The evidence database on its own: schema, writes, reads, corruption."""

import sqlite3
import time

import pytest

from raysleuth.errors import StoreCorrupt, StoreNotFound
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
