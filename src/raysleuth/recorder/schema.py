"""The evidence database's layout: its columns and the migrations that build it, one version each.

Version 3 keeps each sender's identity once (``senders``: the ten columns a batch header carries) and each row
with a number for it (``entries``); ``records`` is the view of both, with every column a ``records`` table had,
in the same order, so every query reads one run's file whatever its version (an older raysleuth refuses a
newer schema and says to upgrade). Writes go to ``entries``
(:meth:`~raysleuth.recorder.store.EvidenceStore.write_batch`); an ``INSERT``, ``UPDATE`` or ``DELETE`` on
``records`` works through its triggers.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

#: The identity columns a batch header carries for all its rows.
IDENTITY_COLUMNS = (
    "world_size", "node_id", "node_ip", "hostname", "pid",
    "actor_id", "actor_name", "actor_class", "client_id", "job_id",
)
#: The per-row columns, in the order a client packs them.
ROW_COLUMNS = ("kind", "time", "rank", "step", "phase", "name", "level", "data", "seq")
COLUMNS = ROW_COLUMNS + IDENTITY_COLUMNS

# Each entry upgrades the schema by one version; never edit a shipped entry.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE records (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        time REAL NOT NULL,
        rank INTEGER,
        step INTEGER,
        phase TEXT,
        name TEXT,
        level TEXT,
        data TEXT NOT NULL DEFAULT '{}',
        seq INTEGER,
        world_size INTEGER,
        node_id TEXT,
        node_ip TEXT,
        hostname TEXT,
        pid INTEGER,
        actor_id TEXT,
        actor_name TEXT,
        actor_class TEXT,
        client_id TEXT
    );
    CREATE INDEX records_kind_time ON records (kind, time);
    CREATE INDEX records_kind_rank ON records (kind, rank, time);
    CREATE UNIQUE INDEX records_delivery ON records (client_id, seq) WHERE client_id IS NOT NULL;
    """,
    # 2: the Ray job that wrote each record, so two jobs on one cluster stay apart (`--job`).
    """
    ALTER TABLE records ADD COLUMN job_id TEXT;
    CREATE INDEX records_job ON records (job_id, kind, time);
    """,
    # 3: each sender's identity once (`senders`), each row a number for it (`entries`); `records` is their view,
    # with every column it had, in the same order (a 1,000-rank hour: ~170 of 220 bytes a row were identity).
    # No index for the job: every reader also names a kind, and SQLite then takes a kind's index (measured: an
    # index on (sender, kind, time) served only COUNTs with no kind, 8-10 % of the file).
    """
    CREATE TABLE senders (
        id INTEGER PRIMARY KEY,
        key TEXT NOT NULL UNIQUE,
        world_size INTEGER,
        node_id TEXT,
        node_ip TEXT,
        hostname TEXT,
        pid INTEGER,
        actor_id TEXT,
        actor_name TEXT,
        actor_class TEXT,
        client_id TEXT,
        job_id TEXT
    );
    CREATE TABLE clients (id INTEGER PRIMARY KEY, client_id TEXT NOT NULL UNIQUE);
    CREATE TABLE entries (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        time REAL NOT NULL,
        rank INTEGER,
        step INTEGER,
        phase TEXT,
        name TEXT,
        level TEXT,
        data TEXT NOT NULL DEFAULT '{}',
        seq INTEGER,
        sender INTEGER,
        client INTEGER
    );
    INSERT OR IGNORE INTO senders (key, world_size, node_id, node_ip, hostname, pid, actor_id, actor_name, actor_class,
                                   client_id, job_id)
        SELECT json_array(world_size, node_id, node_ip, hostname, pid, actor_id, actor_name, actor_class, client_id,
                          job_id), world_size, node_id, node_ip, hostname, pid, actor_id, actor_name, actor_class,
               client_id, job_id FROM records;
    INSERT OR IGNORE INTO clients (client_id) SELECT client_id FROM records WHERE client_id IS NOT NULL;
    INSERT INTO entries (id, kind, time, rank, step, phase, name, level, data, seq, sender, client)
        SELECT id, kind, time, rank, step, phase, name, level, data, seq,
               (SELECT s.id FROM senders s WHERE s.key = json_array(r.world_size, r.node_id, r.node_ip, r.hostname,
                r.pid, r.actor_id, r.actor_name, r.actor_class, r.client_id, r.job_id)),
               (SELECT c.id FROM clients c WHERE c.client_id = r.client_id)
        FROM records r;
    DROP TABLE records;
    CREATE VIEW records AS
        SELECT e.id AS id, e.kind AS kind, e.time AS time, e.rank AS rank, e.step AS step, e.phase AS phase,
               e.name AS name, e.level AS level, e.data AS data, e.seq AS seq, s.world_size AS world_size,
               s.node_id AS node_id, s.node_ip AS node_ip, s.hostname AS hostname, s.pid AS pid,
               s.actor_id AS actor_id, s.actor_name AS actor_name, s.actor_class AS actor_class,
               s.client_id AS client_id, s.job_id AS job_id
        FROM entries e LEFT JOIN senders s ON s.id = e.sender;
    CREATE TRIGGER records_insert INSTEAD OF INSERT ON records BEGIN
        INSERT OR IGNORE INTO senders (key, world_size, node_id, node_ip, hostname, pid, actor_id, actor_name,
                                       actor_class, client_id, job_id)
            VALUES (json_array(NEW.world_size, NEW.node_id, NEW.node_ip, NEW.hostname, NEW.pid, NEW.actor_id,
                               NEW.actor_name, NEW.actor_class, NEW.client_id, NEW.job_id), NEW.world_size,
                    NEW.node_id, NEW.node_ip, NEW.hostname, NEW.pid, NEW.actor_id, NEW.actor_name, NEW.actor_class,
                    NEW.client_id, NEW.job_id);
        INSERT OR IGNORE INTO clients (client_id) SELECT NEW.client_id WHERE NEW.client_id IS NOT NULL;
        INSERT INTO entries (id, kind, time, rank, step, phase, name, level, data, seq, sender, client)
            VALUES (NEW.id, NEW.kind, NEW.time, NEW.rank, NEW.step, NEW.phase, NEW.name, NEW.level,
                    COALESCE(NEW.data, '{}'), NEW.seq,
                    (SELECT id FROM senders WHERE key = json_array(NEW.world_size, NEW.node_id, NEW.node_ip,
                     NEW.hostname, NEW.pid, NEW.actor_id, NEW.actor_name, NEW.actor_class, NEW.client_id, NEW.job_id)),
                    (SELECT id FROM clients WHERE client_id = NEW.client_id));
    END;
    CREATE TRIGGER records_update INSTEAD OF UPDATE ON records BEGIN
        UPDATE entries SET kind = NEW.kind, time = NEW.time, rank = NEW.rank, step = NEW.step, phase = NEW.phase,
                           name = NEW.name, level = NEW.level, data = NEW.data, seq = NEW.seq WHERE id = OLD.id;
    END;
    CREATE TRIGGER records_delete INSTEAD OF DELETE ON records BEGIN
        DELETE FROM entries WHERE id = OLD.id;
    END;
    CREATE INDEX records_kind_time ON entries (kind, time);
    CREATE INDEX records_kind_rank ON entries (kind, rank, time);
    CREATE UNIQUE INDEX records_delivery ON entries (client, seq) WHERE client IS NOT NULL;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def statements(script: str) -> Iterator[str]:
    """The SQL statements of a migration, one at a time (a trigger's body holds semicolons of its own)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                yield pending
            pending = ""


#: A sender's identity as the key of its ``senders`` row (SQLite's own ``json_array``: one spelling everywhere).
KEY_SQL = "json_array(" + ", ".join("?" * len(IDENTITY_COLUMNS)) + ")"
ENTRY_COLUMNS = ROW_COLUMNS + ("sender", "client")
#: What :meth:`~raysleuth.recorder.store.EvidenceStore.write_batch` runs for its rows (a resent row is ignored).
INSERT_ENTRY = (f"INSERT OR IGNORE INTO entries ({', '.join(ENTRY_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(ENTRY_COLUMNS))})")
