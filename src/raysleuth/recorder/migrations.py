"""The migrations that build the evidence database, one schema version each (:mod:`raysleuth.recorder.schema`
says what the layout holds; :meth:`~raysleuth.recorder.store.EvidenceStore` runs them when a writer opens a file)."""

from __future__ import annotations

from raysleuth.recorder.conditions import LOG_SEVERE, SEALED, SPAN_SEALED, SPAN_UNBLOCKED

# Each entry upgrades the schema by one version; never edit a shipped entry.
_COUNT_NEW = "INSERT INTO kind_counts (kind, n) VALUES (NEW.kind, 1) ON CONFLICT (kind) DO UPDATE SET n = n + 1;"
_UNCOUNT_OLD = "UPDATE kind_counts SET n = n - 1 WHERE kind = OLD.kind;"
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
    # 4: a memory sample's numbers in columns (`v0`..`v5`, its `data` ''), not as JSON text: 125 of its 170
    # bytes, and no JSON to parse for a reader of its fields. `records` still shows the JSON (`json_object`, in
    # the template's order); its last columns, `packed` and `v0`..`v5`, serve readers (`reading._field_sql`).
    # Dropping the view drops its triggers: they are made again, and an update writes the JSON back.
    """
    ALTER TABLE entries ADD COLUMN v0;
    ALTER TABLE entries ADD COLUMN v1;
    ALTER TABLE entries ADD COLUMN v2;
    ALTER TABLE entries ADD COLUMN v3;
    ALTER TABLE entries ADD COLUMN v4;
    ALTER TABLE entries ADD COLUMN v5;
    DROP VIEW records;
    CREATE VIEW records AS
        SELECT e.id AS id, e.kind AS kind, e.time AS time, e.rank AS rank, e.step AS step, e.phase AS phase,
               e.name AS name, e.level AS level,
               CASE WHEN e.data = '' THEN CASE e.kind WHEN 'memory' THEN json_object('rss_bytes', e.v0,
                    'uss_bytes', e.v1, 'cuda_allocated_bytes', e.v2, 'cuda_reserved_bytes', e.v3,
                    'cuda_peak_bytes', e.v4, 'source', e.v5) ELSE '{}' END ELSE e.data END AS data,
               e.seq AS seq, s.world_size AS world_size,
               s.node_id AS node_id, s.node_ip AS node_ip, s.hostname AS hostname, s.pid AS pid,
               s.actor_id AS actor_id, s.actor_name AS actor_name, s.actor_class AS actor_class,
               s.client_id AS client_id, s.job_id AS job_id, e.data = '' AS packed, e.v0 AS v0, e.v1 AS v1,
               e.v2 AS v2, e.v3 AS v3, e.v4 AS v4, e.v5 AS v5
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
                    CASE WHEN NEW.data IS NULL OR NEW.data = '' THEN '{}' ELSE NEW.data END, NEW.seq,
                    (SELECT id FROM senders WHERE key = json_array(NEW.world_size, NEW.node_id, NEW.node_ip,
                     NEW.hostname, NEW.pid, NEW.actor_id, NEW.actor_name, NEW.actor_class, NEW.client_id, NEW.job_id)),
                    (SELECT id FROM clients WHERE client_id = NEW.client_id));
    END;
    CREATE TRIGGER records_update INSTEAD OF UPDATE ON records BEGIN
        UPDATE entries SET kind = NEW.kind, time = NEW.time, rank = NEW.rank, step = NEW.step, phase = NEW.phase,
                           name = NEW.name, level = NEW.level,
                           data = CASE WHEN NEW.data IS NULL OR NEW.data = '' THEN '{}' ELSE NEW.data END,
                           seq = NEW.seq, v0 = NULL, v1 = NULL, v2 = NULL, v3 = NULL, v4 = NULL, v5 = NULL
            WHERE id = OLD.id;
    END;
    CREATE TRIGGER records_delete INSTEAD OF DELETE ON records BEGIN
        DELETE FROM entries WHERE id = OLD.id;
    END;
    """,
    # 5: memory samples also kept as columns in blocks, one per sender and source per pass (`recorder.blocks`):
    # a pass copies the samples of ids (lo, hi] that its `SEALED` test takes; readers read the blocks and, row by
    # row, only what no pass holds. Writing, changing or removing a memory row at or below a pass's top drops
    # that pass and every later one (their rows are read row by row again): a block never holds a stale copy.
    # `memory_loose` indexes the memory rows no pass takes (an agent's sample, JSON), for that reader.
    """
    CREATE TABLE block_passes (hi INTEGER PRIMARY KEY, lo INTEGER NOT NULL);
    CREATE TABLE memory_blocks (pass INTEGER NOT NULL, sender INTEGER NOT NULL, source TEXT, n INTEGER NOT NULL,
                                body BLOB NOT NULL);
    CREATE INDEX memory_blocks_pass ON memory_blocks (pass);
    CREATE INDEX memory_loose ON entries (id) WHERE kind = 'memory' AND NOT (""" + SEALED + """);
    CREATE TRIGGER memory_blocks_insert AFTER INSERT ON entries
        WHEN NEW.kind = 'memory' AND NEW.id <= (SELECT coalesce(max(hi), 0) FROM block_passes) BEGIN
        DELETE FROM memory_blocks WHERE pass >= NEW.id;
        DELETE FROM block_passes WHERE hi >= NEW.id;
    END;
    CREATE TRIGGER memory_blocks_update AFTER UPDATE ON entries
        WHEN (OLD.kind = 'memory' OR NEW.kind = 'memory')
             AND min(OLD.id, NEW.id) <= (SELECT coalesce(max(hi), 0) FROM block_passes) BEGIN
        DELETE FROM memory_blocks WHERE pass >= min(OLD.id, NEW.id);
        DELETE FROM block_passes WHERE hi >= min(OLD.id, NEW.id);
    END;
    CREATE TRIGGER memory_blocks_delete AFTER DELETE ON entries
        WHEN OLD.kind = 'memory' AND OLD.id <= (SELECT coalesce(max(hi), 0) FROM block_passes) BEGIN
        DELETE FROM memory_blocks WHERE pass >= OLD.id;
        DELETE FROM block_passes WHERE hi >= OLD.id;
    END;
    """,
    # 6: each worker's newest collectives dump's entries as the matcher reads them, taken out once by a pass of the
    # writer's store (`raysleuth.recorder.compact`): the dump without its arrays (`rest`), its entries per group as
    # rows, the format and cut they were made with, keyed by the dump's id. Writing, changing or removing a dump
    # drops its row (a reader then parses the dump itself); `body` NULL: a dump the pass did not take (a worker's
    # older dump of the same pass, which no reader reads, or one that is not a JSON object: parsed as before).
    """
    CREATE TABLE collective_entries (id INTEGER PRIMARY KEY, format INTEGER NOT NULL, keep INTEGER NOT NULL,
                                     body TEXT);
    CREATE TRIGGER collective_entries_insert AFTER INSERT ON entries WHEN NEW.kind = 'collectives' BEGIN
        DELETE FROM collective_entries WHERE id = NEW.id;
    END;
    CREATE TRIGGER collective_entries_update AFTER UPDATE ON entries
        WHEN OLD.kind = 'collectives' OR NEW.kind = 'collectives' BEGIN
        DELETE FROM collective_entries WHERE id IN (OLD.id, NEW.id);
    END;
    CREATE TRIGGER collective_entries_delete AFTER DELETE ON entries WHEN OLD.kind = 'collectives' BEGIN
        DELETE FROM collective_entries WHERE id = OLD.id;
    END;
    """,
    # 7: each pass of `recorder.blocks` also keeps the top-level spans of its ids as columns, one block a pass
    # (`recorder.span_blocks`): the report's step totals. A span block goes with its pass (dropped with it), and
    # writing, changing or removing a span at or below a pass's top drops that pass and every later one, as a
    # memory row does. Passes made before this version hold no spans (n = -1: their spans are read row by row).
    # `span_loose` indexes the spans with a step and a rank that no pass takes (JSON, unmarked), for that reader.
    """
    CREATE TABLE span_blocks (pass INTEGER PRIMARY KEY, n INTEGER NOT NULL, names TEXT NOT NULL, body BLOB NOT NULL);
    INSERT INTO span_blocks (pass, n, names, body) SELECT hi, -1, '[]', x'' FROM block_passes;
    CREATE INDEX span_loose ON entries (id)
        WHERE kind = 'span' AND step IS NOT NULL AND rank IS NOT NULL AND NOT (""" + SPAN_SEALED + """);
    CREATE TRIGGER span_blocks_pass AFTER DELETE ON block_passes BEGIN
        DELETE FROM span_blocks WHERE pass = OLD.hi;
    END;
    CREATE TRIGGER span_blocks_insert AFTER INSERT ON entries
        WHEN NEW.kind = 'span' AND NEW.id <= (SELECT coalesce(max(hi), 0) FROM block_passes) BEGIN
        DELETE FROM memory_blocks WHERE pass >= NEW.id;
        DELETE FROM block_passes WHERE hi >= NEW.id;
    END;
    CREATE TRIGGER span_blocks_update AFTER UPDATE ON entries
        WHEN (OLD.kind = 'span' OR NEW.kind = 'span')
             AND min(OLD.id, NEW.id) <= (SELECT coalesce(max(hi), 0) FROM block_passes) BEGIN
        DELETE FROM memory_blocks WHERE pass >= min(OLD.id, NEW.id);
        DELETE FROM block_passes WHERE hi >= min(OLD.id, NEW.id);
    END;
    CREATE TRIGGER span_blocks_delete AFTER DELETE ON entries
        WHEN OLD.kind = 'span' AND OLD.id <= (SELECT coalesce(max(hi), 0) FROM block_passes) BEGIN
        DELETE FROM memory_blocks WHERE pass >= OLD.id;
        DELETE FROM block_passes WHERE hi >= OLD.id;
    END;
    """,
    # 8: the warnings and errors among the logs, newest first, on an index: the report's logs section reads the
    # newest 50,000 of them (a full-mode 1,000-rank hour holds 605,000 log lines, 6,000 of them warnings).
    "CREATE INDEX log_severe ON entries (kind, time) WHERE " + LOG_SEVERE,
    # 9: each kind's count of rows, kept as rows are written, changed and removed (`EvidenceStore.kinds`: COUNT walks
    # 6.6 million rows in 0.6 s); later passes' memory blocks hold first values and steps (`recorder.deltas`);
    # `span_unblocked` indexes the spans with a step that no span block holds as written (`timeline --summary`).
    f"""
    CREATE TABLE kind_counts (kind TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
    INSERT INTO kind_counts (kind, n) SELECT kind, COUNT(*) FROM entries GROUP BY kind;
    CREATE TRIGGER kind_counts_insert AFTER INSERT ON entries BEGIN {_COUNT_NEW} END;
    CREATE TRIGGER kind_counts_update AFTER UPDATE OF kind ON entries BEGIN {_UNCOUNT_OLD} {_COUNT_NEW} END;
    CREATE TRIGGER kind_counts_delete AFTER DELETE ON entries BEGIN {_UNCOUNT_OLD} END;
    CREATE INDEX span_unblocked ON entries (id) WHERE {SPAN_UNBLOCKED};
    """,
    # 10: later passes keep their memory samples as one block of every sender (`memory_pass_blocks`: rows by sender,
    # source and id), not a block a sender: a pass of a live run holds a few dozen samples of each of a thousand
    # workers, and a reader paid about 0.1 ms a block (110,000 of them in a full-mode 1,000-rank hour). A block goes
    # with its pass; the blocks of older passes stay, and are read beside these.
    """
    CREATE TABLE memory_pass_blocks (pass INTEGER PRIMARY KEY, n INTEGER NOT NULL, sources TEXT NOT NULL,
                                     body BLOB NOT NULL);
    CREATE TRIGGER memory_pass_blocks_pass AFTER DELETE ON block_passes BEGIN
        DELETE FROM memory_pass_blocks WHERE pass = OLD.hi;
    END;
    """,
)
