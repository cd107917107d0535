"""The report reads at most ``MAX_RECORDS`` records a section and says, per section, how many it left out.

A real store written through ``EvidenceStore.write_batch``; the cap made small so a small run meets it. No Ray.
"""

from __future__ import annotations

import raysleuth.report as report
from raysleuth.recorder.store import EvidenceStore
from older_files import UNDO_9, as_schema_9


def test_a_cut_section_says_what_it_shows_and_what_it_left_out(tmp_path, monkeypatch):
    path = tmp_path / "runs" / "logs" / "evidence.sqlite"
    path.parent.mkdir(parents=True)
    store = EvidenceStore(path)
    header = {"node_ip": "10.0.0.1", "pid": 4242, "client_id": "c0", "actor_class": "TrainWorker"}
    store.write_batch(header, [("log", 1_780_000_000.0 + n, 0, None, None, "train", "WARNING",
                                {"message": f"slow loader {n}"}, n) for n in range(30)])
    store.close()
    monkeypatch.setattr(report, "MAX_RECORDS", 10)
    result = report.generate_report(tmp_path / "r.html", run=str(path))
    store = EvidenceStore(path, readonly=True)
    data = report.build_report_data(store)
    store.close()
    assert data["capped"] == {"logs": {"kept": 10, "held": 30, "left_out": 20}}
    assert [line["message"] for line in data["logs"]["rank 0"]] == [f"slow loader {n}" for n in range(20, 30)]
    html = result.path.read_text()
    assert "logs shows 10 of the run's 30 and leaves out the oldest 20" in html
    monkeypatch.setattr(report, "MAX_RECORDS", 30)  # the whole run fits: nothing said
    store = EvidenceStore(path, readonly=True)
    assert report.build_report_data(store)["capped"] == {}
    store.close()


def test_the_logs_section_cuts_among_warnings_and_errors_so_info_lines_never_push_an_error_off(tmp_path, monkeypatch):
    """The logs section shows warnings and errors: its newest ``MAX_RECORDS`` are of those. Before, the newest of
    every level were read and the rest dropped, so 50,000 INFO lines after an error hid it (and cost 1 s)."""
    path = tmp_path / "runs" / "infos" / "evidence.sqlite"
    path.parent.mkdir(parents=True)
    store = EvidenceStore(path)
    header = {"node_ip": "10.0.0.1", "pid": 4242, "client_id": "c0", "actor_class": "TrainWorker"}
    start = 1_780_000_000.0
    store.write_batch(header, [("log", start, 0, None, None, "train", "ERROR", {"message": "NCCL timeout"}, 0),
                               ("log", start + 1, 0, None, None, "train", "warning", {"message": "lower case"}, 1),
                               ("log", start + 2, 0, None, None, "train", None,  # a foreign row: level in its data
                                {"message": "no level column", "level": "critical"}, 2),
                               ("log", start + 3, 0, None, None, "train", None, {"message": "no level at all"}, 3)]
                      + [("log", start + 10 + n, 0, None, None, "train", "INFO", {"message": f"step {n}"}, 10 + n)
                         for n in range(40)])
    store.close()
    monkeypatch.setattr(report, "MAX_RECORDS", 10)
    store = EvidenceStore(path, readonly=True)
    data = report.build_report_data(store)
    store.close()
    assert [line["message"] for line in data["logs"]["rank 0"]] == ["NCCL timeout", "lower case", "no level column"]
    assert data["capped"] == {}  # 4 rows may be warnings or errors (one says nothing): none cut
    monkeypatch.setattr(report, "MAX_RECORDS", 2)
    store = EvidenceStore(path, readonly=True)
    data = report.build_report_data(store)
    store.close()
    assert data["capped"] == {"logs": {"kept": 2, "held": 4, "left_out": 2}}
    assert [line["message"] for line in data["logs"]["rank 0"]] == ["no level column"]  # the newest two: one says


def test_the_warnings_and_errors_are_read_on_their_own_index_and_a_version_7_file_answers_the_same(tmp_path):
    """Migration 8's ``log_severe`` holds the logs that may be warnings or errors: the section's newest-first read
    and its count walk it (605,000 log lines of a full-mode hour, 6,000 of them warnings: 1.5 s without); a file
    from before it is read by scanning, with the same answer."""
    import sqlite3

    from raysleuth.recorder.reading import where_clause

    path = tmp_path / "evidence.sqlite"
    store = EvidenceStore(path)
    header = {"node_ip": "10.0.0.1", "pid": 4242, "client_id": "c0"}
    store.write_batch(header, [("log", 1_780_000_000.0 + n, 0, None, None, "train",
                                ("ERROR", "INFO", "Warning", None, "DEBUG")[n % 5], {"message": f"line {n}"}, n)
                               for n in range(200)])
    where, args = where_clause(kind="log", severe_logs=True)
    plan = " ".join(row[-1] for row in store._db.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM records WHERE " + " AND ".join(where) + " ORDER BY time DESC", args))
    assert "log_severe" in plan, plan
    newest = [(r.level, r.data["message"]) for r in store.query("log", severe_logs=True, limit=5, newest_first=True)]
    assert newest == [(None, "line 198"), ("Warning", "line 197"), ("ERROR", "line 195"), (None, "line 193"),
                      ("Warning", "line 192")]
    store.close()
    db = sqlite3.connect(path)  # a version 7 file: no index, the same answer
    as_schema_9(db)  # each pass's block of every sender as schema 9 wrote it
    for statement in (*UNDO_9, "DROP INDEX log_severe", "PRAGMA user_version=7"):
        db.execute(statement)
    db.commit()
    db.close()
    old = EvidenceStore(path, readonly=True)
    assert old.schema_version == 7
    assert [(r.level, r.data["message"]) for r in old.query("log", severe_logs=True, limit=5, newest_first=True)] \
        == newest
    old.close()


def test_the_run_summary_reads_writers_and_times_on_the_index_as_it_read_them_by_grouping(tmp_path):
    from types import SimpleNamespace

    from scale_reference import old_identities
    from raysleuth.report import sections

    path = tmp_path / "evidence.sqlite"
    store = EvidenceStore(path)
    for rank in range(6):
        header = {"node_ip": f"10.0.0.{rank // 2}", "hostname": f"h{rank // 2}", "pid": 100 + rank,
                  "client_id": f"c{rank}", "actor_class": "TrainWorker" if rank else None}
        store.write_batch(header, [(kind, 1_780_000_000.0 + 7 * rank + n, rank if n else None, n, None, None, None,
                                    {"step": n}, n * 3 + k) for n in range(5)
                                   for k, kind in enumerate(("span", "memory", "heartbeat"))])
    store.add("doctor", {"ok": True}, time=1_779_999_000.0, hostname="laptop")
    store.close()
    store = EvidenceStore(path, readonly=True)
    old = [SimpleNamespace(rank=rank, node_ip=ip, hostname=host, actor_class=actor, time=when)
           for rank, ip, host, actor, first, last in old_identities(store) for when in (first, last)]
    data = report.build_report_data(store)
    assert data["summary"] == sections.summary_section(store.kinds(), store.meta(), old)
    assert data["summary"]["start"] == 1_779_999_000.0 and data["summary"]["ranks"] == [0, 1, 2, 3, 4, 5]
    store.close()
