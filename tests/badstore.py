"""A run whose evidence holds bad rows: data that is not a JSON object, lacks fields, or has wrong types.

``rs.record`` (and any old or foreign writer) can leave such rows; every
command must read past them with one clear line at most, never a traceback.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from raysleuth.recorder.store import EvidenceStore, run_dir

KINDS = ("consistency", "crash", "memory", "memory_capsule", "span", "event", "heartbeat", "log",
         "stack_report", "tasks", "pool_call", "verl_call", "debug_session", "doctor", "instrumented",
         "collective", "custom", "weight_sync", "logprob_gap")

#: data values a careless writer can store: not an object, empty, foreign fields, wrong types.
BAD_DATA = (
    [1, 2, 3], 5, "plain text", None, {}, {"unexpected": True},
    {"consistent": "maybe", "mismatches": 3, "tensors_checked": "x", "world_size": None, "arrived_ranks": 7},
    {"start": "x", "end": None, "duration_s": "slow", "attrs": [1], "step": "ten"},
    {"rss_bytes": "big", "uss_bytes": [], "source": 3, "time": "t"},
    {"message": None, "exception_type": 5, "frames": "none", "chain": {}, "traceback": 7, "memory": 3},
    {"processes": "x", "groups": None, "verdict": [], "pending": 4, "failed": "f", "stuck": {}},
    {"holders": 3, "threads": [], "now": "n", "recent_samples": 9, "reason": None},
    {"state": 5, "host": [], "port": "p", "since": "s", "kind": None, "id": None},
)


def seed_bad_run(home: Path, run_id: str = "bad-run") -> Path:
    """Write a run under ``home`` whose every kind has every bad shape; returns the database path."""
    path = run_dir(home, run_id) / "evidence.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    store = EvidenceStore(path)
    now = time.time() - 60
    for index, (kind, data) in enumerate((kind, data) for kind in KINDS for data in BAD_DATA):
        store.add(kind, None, time=now + index * 0.01, rank=index % 3, step=index % 5, name=f"{kind}-{index}",
                  level=("ERROR", "INFO", "WARNING", None, "bogus")[index % 5])
    store.close()
    # rewrite data as the bad values exactly (``add`` would wrap None as {})
    db = sqlite3.connect(path)
    rows = db.execute("SELECT id FROM records ORDER BY id").fetchall()
    values = [data for _ in KINDS for data in BAD_DATA]
    for (row_id,), data in zip(rows, values):
        text = data if isinstance(data, str) else json.dumps(data)
        db.execute("UPDATE records SET data = ? WHERE id = ?", (text, row_id))
    db.execute("INSERT INTO records (kind, time, data) VALUES ('log', ?, '{bad json')", (now,))
    db.commit()
    db.close()
    (Path(home) / "runs" / "latest").write_text(run_id)
    return path
