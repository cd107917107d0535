"""Every kind of evidence, written through the real recorder into a real SQLite store, keeps no secret.

Each secret shape of the corpus (``tests/test_redact.py``) is put where a
writer of that kind puts what it captured: a death record's log tail, Ray
message and memory-monitor command lines, a stack report's process titles
(``ps`` argv), ``rs.span`` attributes, ``rs.event`` keyword arguments, a
crash capsule's locals, a log record's extras, values nested deep, bytes
over 4 KiB. The rows are then read back from the SQLite file itself (and
from the write-ahead and spool files a worker leaves on disk), and no secret
may be in them.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import raysleuth as rs
from raysleuth.recorder import RecordClient, StoreSink, reset_client
from raysleuth.recorder.store import EvidenceStore
from test_redact import SECRETS


def _value(kind: str, value: object) -> object:
    """A corpus entry as a writer holds it: text as text, ``(name, value)`` as ``{name: value}``."""
    if kind in ("repr", "record"):
        name, inner = value
        return {name: inner}
    if kind == "env":
        return {"environment": value}
    return value


CASES = [(index, _value(kind, value), secret) for index, (kind, value, secret) in enumerate(SECRETS)]

#: Where each kind's writer puts what it captured (``v``: the captured value).
TEMPLATES = {
    "death": lambda v: {"cause": "sigkill", "summary": "killed by SIGKILL", "evidence": [v],
                        "log_tail": {"err": ["Traceback (most recent call last):", v]},
                        "ray_message": v, "top_memory_users": [{"pid": 7, "memory_gb": 2.5, "command": v}]},
    "stack_report": lambda v: {"processes": [{"pid": 3, "title": v, "rank": 0, "threads": [
        {"name": "MainThread", "frames": [{"function": "step", "file": "/app/train.py", "line": 3, "locals": v}]}]}]},
    "crash": lambda v: {"exception_type": "RuntimeError", "message": v, "frames": [{"locals": {"config": v}}]},
    "log": lambda v: {"logger": "train", "message": v, "extra": {"context": v}},
    "memory_capsule": lambda v: {"frames": [{"file": "/app/train.py", "line": 9, "source": v}]},
    "consistency": lambda v: {"key": "params", "consistent": False, "notes": [v]},
    "tasks": lambda v: {"failed": [{"task_id": "ab" * 16, "error_message": v}]},
    "pool_call": lambda v: {"method": "train", "args": [v], "kwargs": {"config": v}},
    "verl_call": lambda v: {"method": "generate_sequences", "args": [[v]]},
    "debug_session": lambda v: {"kind": "pdb", "command": v},
    "collectives": lambda v: {"group": "default", "entries": [{"op": "all_reduce", "frames": [v]}]},
    "memory": lambda v: {"rss_bytes": 1 << 30, "source": v},
}


def _rows(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT kind, name, phase, data FROM records").fetchall()


def _leaks(text: str, secret: str) -> bool:
    if len(secret) < 6:  # "pp", "abc", 1234: as a whole JSON value, not inside "/app/train.py"
        return any(f"{lead}{secret}{tail}" in text for lead in ('"', ":", " ") for tail in ('"', ",", "}", "]"))
    return secret in text or json.dumps(secret)[1:-1] in text


@pytest.fixture()
def client(tmp_path):
    store = EvidenceStore(tmp_path / "evidence.sqlite")
    client = RecordClient(StoreSink(store), interval=60.0, spool_dir=tmp_path / "spool")
    old = reset_client(client)
    yield client, store
    client.close(timeout=5)
    reset_client(old)


def test_every_kind_of_record_is_stored_without_its_secrets(client, tmp_path):
    client, store = client
    for index, value, _ in CASES:
        for kind, template in TEMPLATES.items():
            client.record(kind, template(value), name=f"case-{index}", level="ERROR" if kind == "death" else None)
        with rs.span(f"case-{index}", detail=value, nested={"a": {"b": {"c": value}}}):  # the real span path
            pass
        rs.event(f"case-{index}", detail=value, argv=["python", "train.py", value])  # the real event path
        store.add("doctor", {"checks": [{"name": "env", "detail": value}]}, name=f"case-{index}")  # a direct write
    wal = b"".join(path.read_bytes() for path in (tmp_path / "spool").glob("*.wal.jsonl"))
    assert wal, "death records (level ERROR) are written ahead to disk"
    assert client.flush(timeout=60)
    rows = _rows(store.path)
    kinds = {row[0] for row in rows}
    assert kinds >= set(TEMPLATES) | {"span", "event", "doctor"}
    assert len(rows) == len(CASES) * (len(TEMPLATES) + 3)
    by_case: dict[str, list[str]] = {}
    for kind, name, phase, data in rows:
        by_case.setdefault(name, []).append(f"{kind} {phase} {data}")
    leaks = [(index, secret, text[:300]) for index, _, secret in CASES for text in by_case[f"case-{index}"]
             if _leaks(text, secret)]
    assert not leaks, leaks[:5]
    wal_text = wal.decode("utf-8", "replace")
    assert not [secret for _, _, secret in CASES if _leaks(wal_text, secret)]


class _WriterDown:
    """The writer actor unreachable: every batch goes to the spool file on the worker's disk."""

    def deliver(self, header, rows):
        raise ConnectionError("writer unreachable")


def test_spooled_records_keep_no_secret(tmp_path):
    client = RecordClient(_WriterDown(), interval=60.0, spool_dir=tmp_path / "spool")
    client.write_ahead = False
    for index, value, _ in CASES:
        client.record("death", TEMPLATES["death"](value), name=f"case-{index}")
    assert not client.flush(timeout=30)
    spooled = "".join(path.read_text() for path in (tmp_path / "spool").glob("*.jsonl"))
    assert spooled.count("case-") == len(CASES)
    assert not [secret for _, _, secret in CASES if _leaks(spooled, secret)]
    client._closed = True  # nothing to deliver to


def test_evidence_that_is_no_secret_is_kept_whole():
    """Redacting every record must not eat the evidence: ids, paths, numbers and long lists stay."""
    from raysleuth.redaction import redact_record

    actor = "5f" * 16
    data = {"actor_id": actor, "dead_actors": [actor, "7a" * 16], "pids": list(range(500)), "loss": 0.25,
            "file": "/tmp/ray/session_x/logs/worker-" + "ab" * 28 + "-01000000-42.out",
            "summary": f"actor {actor} died: killed by SIGKILL", "digest": "c0ffee" * 6, "ok": True, "none": None,
            "config": json.dumps({"lr": 0.1, "layers": [1, 2]})}
    assert redact_record(data) == data
