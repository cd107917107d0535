"""The evidence database: SQLite in WAL mode, one file per run.

Layout: ``$RAYSLEUTH_HOME/runs/<run-id>/evidence.sqlite``; ``runs/latest``
holds the id of the newest run. Every record is one row of ``records`` (a
view since schema 3, :mod:`.schema`): who (rank, node, pid, actor), when
(time, step, phase), what (``kind``, ``name``, ``level``) and JSON ``data``.
Features choose a ``kind`` ("log", "span", "memory", ...) and query it back.

Only the writer actor writes while a cluster runs; readers (the CLI) open
the file read-only, so evidence outlives the job. Nothing read back is ever
unpickled: data is JSON.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysleuth.errors import StoreCorrupt, StoreNotFound, UsageError
from raysleuth.recorder import blocks, compact, counting, reading
from raysleuth.recorder.files import private_file, write_private
from raysleuth.recorder.reading import where_clause
from raysleuth.recorder.schema import (
    COLUMNS,
    IDENTITY_COLUMNS,
    INSERT_ENTRY,
    KEY_SQL,
    MIGRATIONS,
    ROW_COLUMNS,
    SCHEMA_VERSION,
    dumps,
    entry,
    statements,
)
from raysleuth.redaction import redact_record

__all__ = ["COLUMNS", "IDENTITY_COLUMNS", "MIGRATIONS", "ROW_COLUMNS", "EvidenceStore", "Record", "SCHEMA_VERSION",
           "latest_run", "list_runs", "resolve_store_path", "run_dir"]

DB_NAME = "evidence.sqlite"


@dataclass
class Record:
    """One row of evidence, as read back."""

    id: int
    kind: str
    time: float
    rank: int | None = None
    step: int | None = None
    phase: str | None = None
    name: str | None = None
    level: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    seq: int | None = None
    world_size: int | None = None
    node_id: str | None = None
    node_ip: str | None = None
    hostname: str | None = None
    pid: int | None = None
    actor_id: str | None = None
    actor_name: str | None = None
    actor_class: str | None = None
    client_id: str | None = None
    job_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict."""
        return dict(self.__dict__)


def redacted_row(row: Sequence[Any]) -> tuple:
    """A row (``ROW_COLUMNS``) as it may be written: its phase, name and data through the one redactor.

    The client applies it to every row leaving a worker's buffer (and to
    write-ahead lines), :meth:`EvidenceStore.add` to direct writes.
    """
    phase, name = row[4], row[5]
    return (row[0], row[1], row[2], row[3], redact_record(phase) if type(phase) is str else phase,
            redact_record(name) if type(name) is str else name, row[6], redact_record(row[7]), row[8])


def run_dir(home: Path, run_id: str) -> Path:
    """The folder of one run."""
    return Path(home) / "runs" / run_id


def list_runs(home: Path) -> list[str]:
    """Run ids under ``home``, oldest first (by database modification time)."""
    runs = Path(home) / "runs"
    if not runs.is_dir():
        return []
    found = [p for p in runs.iterdir() if (p / DB_NAME).exists()]
    return [p.name for p in sorted(found, key=lambda p: (p / DB_NAME).stat().st_mtime)]


def latest_run(home: Path) -> str | None:
    """The newest run: the id in ``runs/latest``, else the newest database."""
    marker = Path(home) / "runs" / "latest"
    try:
        run_id = marker.read_text().strip()
        if run_id and (run_dir(home, run_id) / DB_NAME).exists():
            return run_id
    except OSError:
        pass
    runs = list_runs(home)
    return runs[-1] if runs else None


def resolve_store_path(home: Path, run: str | None = None) -> Path:
    """The database path of ``run`` (an id, a path, or ``None`` for the latest)."""
    if run:
        candidate = Path(run).expanduser()
        for path in (candidate, candidate / DB_NAME, run_dir(home, run) / DB_NAME):
            try:
                if path.is_file():
                    return path
            except (OSError, ValueError):  # a name too long, a NUL: not a run
                continue
        known = ", ".join(list_runs(home)[-5:]) or "none"
        raise StoreNotFound(
            f"no evidence for run {run!r} under {home}",
            fix=f"pick one of the recorded runs ({known}) or pass a path to an evidence.sqlite",
        )
    latest = latest_run(home)
    if latest is None:
        raise StoreNotFound(
            f"no run recorded under {home}",
            fix="run an instrumented job first (or `raysleuth demo`), or set RAYSLEUTH_HOME / --home",
        )
    return run_dir(home, latest) / DB_NAME


class EvidenceStore:
    """One run's evidence database. Open for writing (the writer) or read-only."""

    def __init__(self, path: Path | str, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.Lock()
        self._senders: dict[tuple, tuple[int, int | None]] = {}  # identity -> (senders id, clients id), committed
        self._unsealed = 0  # memory rows written since the last pass (recorder.blocks)
        self._dumps = compact.Passes()  # the dumps' entries, taken out once for their readers
        try:
            if readonly:
                if not self.path.is_file():
                    raise StoreNotFound(f"no evidence database at {self.path}",
                                        fix="check the run id or RAYSLEUTH_HOME")
                self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                           check_same_thread=False, timeout=10)
            else:
                if not self.path.exists():  # 0600 (SQLite gives its -wal and -shm the same mode), in a 0700 folder
                    os.close(private_file(self.path, os.O_WRONLY | os.O_CREAT))
                self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
                for attempt in range(601):  # SQLite does not wait while another process turns a new file to WAL
                    try:
                        self._db.execute("PRAGMA journal_mode=WAL")
                        break
                    except sqlite3.OperationalError as error:
                        if "locked" not in str(error) or attempt == 600:
                            raise
                        time.sleep(0.05)
                self._db.execute("PRAGMA synchronous=NORMAL")
            self._version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if not readonly:
                self._migrate()
            elif self._version > SCHEMA_VERSION:
                raise StoreCorrupt(
                    f"{self.path} has schema version {self._version}, newer than this raysleuth ({SCHEMA_VERSION})",
                    fix="upgrade raysleuth to read it",
                )
        except sqlite3.DatabaseError as error:
            raise StoreCorrupt(
                f"{self.path} is not a readable evidence database ({error})",
                fix="move the file aside; a new run starts a fresh one",
            ) from None

    # ---------------------------------------------------------------- schema

    @property
    def schema_version(self) -> int:
        """The schema version of the open file."""
        return self._version

    @property
    def rows_table(self) -> str:
        """Where a query that reads no identity column (``COLUMNS[:9]`` and ``id``) reads fastest: the rows
        themselves (``entries``, version 3 on), or the ``records`` table of an older file. SQLite keeps the
        join to ``senders`` in an aggregate over the ``records`` view (``COUNT(*)`` then reads every row)."""
        return "entries" if self._version >= 3 else "records"

    def _migrate(self) -> None:
        with self._lock, self._db:  # commits, or rolls back on an error
            self._db.execute("BEGIN IMMEDIATE")  # the version is read under the write lock: a second opener waits
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            for number in range(version, SCHEMA_VERSION):
                for statement in statements(MIGRATIONS[number]):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={number + 1}")
            if version == 0:
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('created', ?)", (str(time.time()),))
            self._version = SCHEMA_VERSION

    def set_meta(self, key: str, value: Any) -> None:
        """Store one run-level fact (JSON)."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, dumps(value)))
            self._db.commit()

    def meta(self) -> dict[str, Any]:
        """All run-level facts."""
        result = {}
        for key, value in self._db.execute("SELECT key, value FROM meta"):
            try:
                result[key] = json.loads(value)
            except ValueError:
                result[key] = value
        return result

    # ----------------------------------------------------------------- write

    def write_batch(self, header: dict[str, Any], rows: Sequence[Sequence[Any]]) -> int:
        """Insert rows packed as ``ROW_COLUMNS`` sharing one identity ``header``.

        A row already delivered (same client id and sequence number) is
        ignored, so a batch sent twice after a lost acknowledgement is safe.
        Returns the number of rows newly inserted.
        """
        return self.write_batches([(header, rows)])[0]

    def write_batches(self, batches: Sequence[tuple[dict[str, Any], Sequence[Sequence[Any]]]]) -> list[int]:
        """:meth:`write_batch` for several ``(header, rows)`` in one transaction (a node's batches, relayed)."""
        # a writer's file is always the newest schema (migrated when opened)
        packed = [(tuple(header.get(name) for name in IDENTITY_COLUMNS), [entry(row) for row in rows])
                  for header, rows in batches]
        added = []
        with self._lock:
            try:
                for identity, entries in packed:
                    sender, client = self._senders.get(identity) or self._sender(identity)  # the identity once
                    for row in entries:
                        row[9], row[10] = sender, client
                    # the rows inserted (sqlite3_changes: a trigger's own writes are not counted, a row ignored is 0)
                    added.append(self._db.executemany(INSERT_ENTRY, entries).rowcount)
                self._db.commit()
            except BaseException:
                self._senders.clear()  # a sender row written in the transaction undone is gone
                self._db.rollback()
                raise
            self._unsealed += sum(row[0] == "memory" for _, entries in packed for row in entries)
            if self._unsealed >= blocks.PASS_ROWS:
                self._unsealed = blocks.seal_quietly(self._db)
            self._dumps.after(self._db, any(row[0] == "collectives" for _, entries in packed for row in entries))
            return added

    def _sender(self, identity: tuple) -> tuple[int, int | None]:
        """The ``senders`` and ``clients`` ids of ``identity`` (written where new; the caller holds the lock)."""
        self._db.execute(f"INSERT OR IGNORE INTO senders (key, {', '.join(IDENTITY_COLUMNS)}) "
                         f"VALUES ({KEY_SQL}, {', '.join('?' * len(IDENTITY_COLUMNS))})", identity + identity)
        sender = self._db.execute(f"SELECT id FROM senders WHERE key = {KEY_SQL}", identity).fetchone()[0]
        client_id = identity[IDENTITY_COLUMNS.index("client_id")]
        client = None
        if client_id is not None:
            self._db.execute("INSERT OR IGNORE INTO clients (client_id) VALUES (?)", (client_id,))
            client = self._db.execute("SELECT id FROM clients WHERE client_id = ?", (client_id,)).fetchone()[0]
        if len(self._senders) > 100_000:
            self._senders.clear()
        self._senders[identity] = (sender, client)
        return sender, client

    def add(self, kind: str, data: dict[str, Any] | None = None, **columns: Any) -> None:
        """Insert one record directly (driver-side evidence such as a doctor run)."""
        row = (kind, columns.pop("time", time.time()), columns.pop("rank", None), columns.pop("step", None),
               columns.pop("phase", None), columns.pop("name", None), columns.pop("level", None),
               data or {}, None)
        self.write_batch(columns, [redacted_row(row)])

    # ------------------------------------------------------------------ read

    def query(
        self,
        kind: str | Iterable[str] | None = None,
        *,
        rank: int | Iterable[int] | None = None,
        job: str | Iterable[str] | None = None,
        name: str | None = None,
        since: float | None = None,
        after_id: int | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
        levels: Iterable[str] | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        ids: Iterable[int] | None = None,
        severe_logs: bool = False,
    ) -> list[Record]:
        """Records matching every given filter, in time order (``job``: Ray job ids, e.g. ``"02000000"``)."""
        where, args = where_clause(kind=kind, rank=rank, job=job, name=name, since=since, after_id=after_id, ids=ids,
                                   step_min=step_min, step_max=step_max, levels=levels, severe_logs=severe_logs)
        if self._version < 2 and job is not None:
            return []  # a run recorded before job ids: no record names a job
        selected = COLUMNS if self._version >= 2 else COLUMNS[:-1] + ("NULL",)  # read old runs as they are
        sql = "SELECT id, " + ", ".join(selected) + " FROM records"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY time DESC, id DESC" if newest_first else " ORDER BY time, id"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        try:
            rows = self._db.execute(sql, args).fetchall()
        except OverflowError:
            raise UsageError("a number in the query is too large for the evidence store",
                             fix="pass ranks, steps and ids as they appear in the records") from None
        except sqlite3.DatabaseError as error:
            raise StoreCorrupt(f"{self.path} could not be read ({error})",
                               fix="move the file aside; a new run starts a fresh one") from None
        return [self._record(row) for row in rows]

    def select(self, kind: str | Iterable[str] | None, columns: Sequence[str] = ("time",), fields: Sequence[str] = (),
               **options: Any) -> Iterator[tuple]:
        """The fast read path: only ``columns`` and ``data`` ``fields``, streamed (see :mod:`.reading`)."""
        return reading.select(self, kind, columns, fields, **options)

    @staticmethod
    def _record(row: Sequence[Any]) -> Record:
        values = dict(zip(("id",) + COLUMNS, row))
        try:
            values["data"] = json.loads(values["data"]) if values["data"] else {}
        except ValueError:
            values["data"] = {"raw": values["data"]}
        if not isinstance(values["data"], dict):  # rs.record("kind", [1, 2]) or a foreign writer
            values["data"] = {"value": values["data"]}
        return Record(**values)

    def count(self, kind: str | None = None) -> int:
        """How many records (of ``kind``) the run holds."""
        if kind is None:
            return self._db.execute(f"SELECT COUNT(*) FROM {self.rows_table}").fetchone()[0]
        return self._db.execute(f"SELECT COUNT(*) FROM {self.rows_table} WHERE kind = ?", (kind,)).fetchone()[0]

    def jobs(self) -> dict[str, int]:
        """Record counts by Ray job id (records without one are left out)."""
        if self._version < 2:
            return {}
        return dict(self._db.execute(
            "SELECT job_id, COUNT(*) FROM records WHERE job_id IS NOT NULL GROUP BY job_id ORDER BY MIN(id)"))

    def ranks(self) -> list[int]:
        """Every rank some record of the run carries, sorted (off the (kind, rank, time) index: ``counting.ranks``)."""
        return counting.ranks(self)

    def kinds(self) -> dict[str, int]:
        """Record counts by kind (kept as rows are written from schema 9 on, else counted)."""
        if self._version >= 9:
            return dict(self._db.execute("SELECT kind, n FROM kind_counts WHERE n > 0 ORDER BY kind"))
        return dict(self._db.execute(f"SELECT kind, COUNT(*) FROM {self.rows_table} GROUP BY kind ORDER BY kind"))

    def check(self) -> str:
        """SQLite's own integrity check ('ok' when healthy)."""
        return self._db.execute("PRAGMA quick_check").fetchone()[0]

    def close(self) -> None:
        """Close the connection (a writer's first seals what it wrote since its last pass)."""
        try:
            if not self.readonly:
                with self._lock:  # as every write: a batch stored meanwhile is not committed half-way by a pass
                    if self._unsealed:
                        blocks.seal_quietly(self._db)
                    self._dumps.close(self._db)
            self._db.close()
        except Exception:
            pass


def open_run(home: Path, run_id: str, *, take_latest: bool = True) -> EvidenceStore:
    """Open (creating) a run's database for writing and mark it the latest.

    ``take_latest=False`` marks it only where no run is marked yet: the
    ``local`` run of a process that recorded before it connected to Ray must
    not hide its cluster's run from the CLI.
    """
    path = run_dir(home, run_id) / DB_NAME
    store = EvidenceStore(path)
    marker = Path(home) / "runs" / "latest"
    if not take_latest and latest_run(home) not in (None, run_id):
        return store
    tmp = marker.with_name(f".latest.{os.getpid()}")
    write_private(tmp, run_id.encode())
    os.replace(tmp, marker)
    return store
