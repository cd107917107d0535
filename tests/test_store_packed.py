"""Schema 4: a memory sample's numbers in columns of their own, read back exactly as they were written.

Each test writes the same samples twice: as a dict (the recorder's rows: packed into the value columns when the
dict is the template exactly) and as JSON text (stored as JSON, as every version before 4 stored it). Whatever
reads them, the ``records`` view, ``select``'s fields, the SQL aggregates and the memory verdict, must not tell
the two apart.
"""

import json
import random
import sqlite3

from raysleuth.memory import memory_report
from raysleuth.recorder import reading
from raysleuth.recorder.schema import MIGRATIONS, PACKED, statements
from raysleuth.recorder.store import SCHEMA_VERSION, EvidenceStore

MiB = 2**20
TEMPLATE = PACKED["memory"]


def _sample(rng: random.Random, t: float, rank: int, cuda: bool = True) -> dict:
    uss = 6_000 * MiB + rank * MiB + rng.randint(-8, 8) * MiB + int(t) * 1000 * rank
    return {"rss_bytes": uss + 900 * MiB, "uss_bytes": uss,
            "cuda_allocated_bytes": 30_000 * MiB + rng.randint(0, 64) * MiB if cuda else None,
            "cuda_reserved_bytes": 34_000 * MiB if cuda else None, "cuda_peak_bytes": 33_000 * MiB if cuda else None,
            "source": "watch"}


#: Memory rows that are not the template: each must be stored as JSON and read back unchanged.
NOT_TEMPLATE = [
    {"rss_bytes": 1, "uss_bytes": 2, "cuda_allocated_bytes": None, "cuda_reserved_bytes": None,
     "cuda_peak_bytes": None, "source": "agent", "vms_bytes": 9, "pid": 7, "node_ip": "10.0.0.9"},  # an agent's
    {"rss_bytes": 1.5, "uss_bytes": 2, "cuda_allocated_bytes": None, "cuda_reserved_bytes": None,
     "cuda_peak_bytes": None, "source": "watch"},  # a float: json_object would give 15 digits back
    {"rss_bytes": True, "uss_bytes": 2, "cuda_allocated_bytes": None, "cuda_reserved_bytes": None,
     "cuda_peak_bytes": None, "source": "watch"},  # a bool: would read back as 1
    {"uss_bytes": 2, "rss_bytes": 1, "cuda_allocated_bytes": None, "cuda_reserved_bytes": None,
     "cuda_peak_bytes": None, "source": "watch"},  # another key order
    {"rss_bytes": 2**70, "uss_bytes": 2, "cuda_allocated_bytes": None, "cuda_reserved_bytes": None,
     "cuda_peak_bytes": None, "source": "watch"},  # past 64 bits
    {"rss_bytes": 1, "uss_bytes": 2, "cuda_allocated_bytes": None, "cuda_reserved_bytes": None,
     "cuda_peak_bytes": None, "source": {"nested": [1, "é"]}},
]


def _runs(ranks: int = 4, samples: int = 60) -> list[tuple[int, list[tuple]]]:
    rng = random.Random(4)
    runs = []
    for rank in range(ranks):
        rows = [("memory", 1000.0 + k * 10.0 + rank * 0.001, rank, k // 2, None, None, None,
                 _sample(rng, k * 10.0, rank, cuda=rank != 1), k) for k in range(samples)]
        if rank == 0:
            rows += [("memory", 2000.0 + k, 0, None, None, None, None, data, samples + k)
                     for k, data in enumerate(NOT_TEMPLATE)]
        rows.append(("log", 1500.0, rank, 3, None, "train", "INFO", {"message": "é ok"}, samples + 99))
        runs.append((rank, rows))
    return runs


def _by_id(store, kind=None) -> list:
    return sorted(store.query(kind), key=lambda record: record.id)


def _write(path, runs, as_text: bool) -> EvidenceStore:
    store = EvidenceStore(path)
    for rank, rows in runs:
        header = {"client_id": f"client{rank}", "pid": 100 + rank, "node_ip": "10.0.0.1", "job_id": "01000000"}
        store.write_batch(header, [row[:7] + (json.dumps(row[7], separators=(",", ":")) if as_text else row[7], row[8]) for row in rows])
    return store


def test_a_template_sample_is_stored_in_columns_and_every_reader_reads_it_as_the_json_it_was(tmp_path):
    runs = _runs()
    packed, text = _write(tmp_path / "packed.sqlite", runs, False), _write(tmp_path / "text.sqlite", runs, True)
    raw = sqlite3.connect(packed.path)
    stored = raw.execute("SELECT data = '', v0, v5 FROM entries WHERE kind = 'memory' ORDER BY id").fetchall()
    templates = sum(len(rows) for _, rows in runs) - len(NOT_TEMPLATE) - len(runs)
    assert [row[0] for row in stored] == [1] * 60 + [0] * len(NOT_TEMPLATE) + [1] * (templates - 60)
    assert all(v0 is not None and v5 == "watch" for is_packed, v0, v5 in stored if is_packed)
    assert raw.execute("SELECT COUNT(*) FROM entries WHERE data = '' AND kind <> 'memory'").fetchone() == (0,)
    assert sqlite3.connect(text.path).execute("SELECT COUNT(*) FROM entries WHERE data = ''").fetchone() == (0,)

    written = [row[7] for _, rows in runs for row in rows]
    for store in (packed, text):  # the records view: the same dicts, in the same key order, the same types
        read = [r.data for r in _by_id(store)]
        assert read == written and [list(d) for d in read] == [list(d) for d in written]
        assert [[type(v) for v in d.values()] for d in read] == [[type(v) for v in d.values()] for d in written]
    fields = [*TEMPLATE, "pid", "vms_bytes", "source.nested", "rss_bytes:number", "source:number", "rss_bytes:json",
              "source:json", "cuda_peak_bytes:json", "message"]
    columns = ("id", "time", "rank", "step", "pid", "node_ip", "data")
    for kind in ("memory", ["memory", "log"], None):
        assert list(packed.select(kind, columns, fields, order="rank")) == \
            list(text.select(kind, columns, fields, order="rank"))
    assert list(reading.buckets(packed, "memory", "rss_bytes", 60.0, start=1000.0)) == \
        list(reading.buckets(text, "memory", "rss_bytes", 60.0, start=1000.0))
    assert memory_report(packed).to_dict()["workers"] == memory_report(text).to_dict()["workers"]


def test_a_version_3_file_reads_as_before_and_once_migrated_keeps_new_samples_in_columns(tmp_path):
    runs = _runs(ranks=2)
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)  # a file raysleuth wrote before version 4: every memory sample as JSON
    for number in range(3):
        for statement in statements(MIGRATIONS[number]):
            db.execute(statement)
    db.execute("PRAGMA user_version=3")
    db.execute("INSERT INTO senders (id, key, pid) VALUES (1, '[1]', 100)")
    db.executemany("INSERT INTO entries (kind, time, rank, step, phase, name, level, data, seq, sender) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1)", [row[:7] + (json.dumps(row[7]), row[8])
                                                              for row in runs[0][1]])
    db.commit()
    db.close()
    old = EvidenceStore(path, readonly=True)
    before = [r.data for r in _by_id(old)]
    before_fields = list(old.select("memory", ("id",), TEMPLATE, order="id"))
    assert old.schema_version == 3 and before == [row[7] for row in runs[0][1]]
    old.close()

    store = EvidenceStore(path)  # a writer migrates: the old rows stay as they are, new samples go in columns
    assert store.schema_version == SCHEMA_VERSION == 10
    assert [r.data for r in _by_id(store)] == before
    assert list(store.select("memory", ("id",), TEMPLATE, order="id")) == before_fields
    store.write_batch({"client_id": "new", "pid": 101}, runs[1][1])
    assert [r.data for r in _by_id(store)] == before + [row[7] for row in runs[1][1]]
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT COUNT(*) FROM entries WHERE data = ''").fetchone()[0] == 60


def test_raw_sql_through_the_view_keeps_a_packed_sample_whole(tmp_path):
    store = _write(tmp_path / "e.sqlite", _runs(ranks=1, samples=3), False)
    first = _by_id(store, "memory")[0]
    db = sqlite3.connect(store.path)
    db.execute("UPDATE records SET level = 'WARNING' WHERE id = ?", (first.id,))  # the JSON is written back
    db.execute("INSERT INTO records (kind, time, data) VALUES ('memory', 5.0, '')")  # '' is not a packed row
    db.commit()
    again = EvidenceStore(store.path, readonly=True)
    updated = _by_id(again, "memory")[0]
    assert updated.level == "WARNING" and updated.data == first.data
    assert db.execute("SELECT data <> '' FROM entries WHERE id = ?", (first.id,)).fetchone() == (1,)
    assert _by_id(again, "memory")[-1].data == {}


def test_packed_samples_take_under_55_percent_of_the_bytes_of_json_ones(tmp_path):
    """The rows alone (a packed file also keeps its samples' second copy in blocks, for readers: under 24 bytes a
    sample of these random values, which change more from one sample to the next than a process's memory does)."""
    runs = _runs(ranks=8, samples=1500)
    sizes = {}
    for as_text in (False, True):
        _write(tmp_path / f"{as_text}.sqlite", runs, as_text).close()  # its last pass: at close
        db = sqlite3.connect(tmp_path / f"{as_text}.sqlite")
        held, sealed = db.execute("SELECT coalesce(sum(length(body)), 0), coalesce(sum(n), 0) "
                                  "FROM memory_pass_blocks").fetchone()
        assert (held < 24 * sealed and sealed == 12_000) if not as_text else not sealed, (held, sealed)
        db.execute("DELETE FROM memory_pass_blocks")
        db.commit()
        db.execute("VACUUM")
        db.close()
        sizes[as_text] = (tmp_path / f"{as_text}.sqlite").stat().st_size
    assert sizes[False] < 0.55 * sizes[True], sizes
