"""What the report and the reading commands say about the frozen run of ``tests/data/evidence/run.jsonl``.

``tests/test_evidence_same.py`` compares these outputs with ``tests/data/evidence/before.json``, which
holds the same outputs from the code before the evidence package (commit f51b333), written by:

    PYTHONPATH=src python tests/evidence_outputs.py tests/data/evidence/before.json

The run's rows were written by the real features (``tests/data/evidence/make_run.py``); they are loaded
into a fresh real store as stored, column by column.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "evidence"
RUN = "evidence-same"
COMMANDS = {
    "crashes": ["crashes"],
    "crashes --json": ["crashes", "--json"],
    "crashes show crash": ["crashes", "show", "{crash}"],
    "crashes show crash --json": ["crashes", "show", "{crash}", "--json"],
    "crashes show death": ["crashes", "show", "{death}"],
    "timeline --summary": ["timeline", "--summary", "--no-ray-tasks"],
    "timeline --summary --json": ["timeline", "--summary", "--no-ray-tasks", "--json"],
    "logs": ["logs"],
    "logs --json": ["logs", "--json"],
    "logs --aggregate": ["logs", "--aggregate"],
    "memory": ["memory"],
    "memory --json": ["memory", "--json"],
}


def load_run(home: Path, rows_file: Path = DATA / "run.jsonl") -> Path:
    """A real store under ``home`` holding the rows of ``rows_file`` as they were stored."""
    from raysleuth.recorder.store import open_run

    store = open_run(home, RUN, take_latest=False)
    store.set_meta("run_id", RUN)
    store.close()
    db = sqlite3.connect(home / "runs" / RUN / "evidence.sqlite")
    with db:
        for line in rows_file.read_text().splitlines():
            row = json.loads(line)
            columns = sorted(row)
            db.execute(f"INSERT INTO records ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                       [row[column] for column in columns])
    db.close()
    return home / "runs" / RUN / "evidence.sqlite"


def _cli(*argv: str) -> dict:
    from raysleuth.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return {"exit": code, "stdout": out.getvalue()}


def _ids(path: Path) -> dict[str, str]:
    db = sqlite3.connect(path)
    try:
        return {kind: str(db.execute("SELECT MIN(id) FROM records WHERE kind = ?", (kind,)).fetchone()[0])
                for kind in ("crash", "death")}
    finally:
        db.close()


def outputs(home: Path) -> dict:
    """Every output, keyed by what made it (the report's section data, its HTML, each command)."""
    from raysleuth.recorder.store import EvidenceStore
    from raysleuth.report import build_report_data, render_report

    path = load_run(home)
    ids = _ids(path)
    store = EvidenceStore(path, readonly=True)
    try:
        data = build_report_data(store)
    finally:
        store.close()
    result = {"report data": json.loads(json.dumps(data, default=repr, sort_keys=True))}
    html = render_report(data, title="evidence-same", inline_js=False)
    result["report html"] = re.sub(r"generated [^<]*", "generated …", html)
    for label, argv in COMMANDS.items():
        argv = [part.format(**ids) for part in argv] + ["--run", RUN, "--home", str(home)]
        result[label] = _cli(*argv)
        result[label]["stdout"] = result[label]["stdout"].replace(str(home), "<home>")
    return result


def same_environment() -> None:
    """Outputs that depend on the machine made the same: UTC times, no terminal width."""
    os.environ["TZ"] = "UTC"
    time.tzset()
    os.environ.pop("COLUMNS", None)
    os.environ["RAY_ADDRESS"] = "127.0.0.1:1"  # no command may reach a cluster


if __name__ == "__main__":
    same_environment()
    with tempfile.TemporaryDirectory() as folder:
        os.environ["RAYSLEUTH_HOME"] = folder
        Path(sys.argv[1]).write_text(json.dumps(outputs(Path(folder)), indent=1, sort_keys=True) + "\n")
