"""What the newest migrations added, as statements that take it out again: tests make files of older versions by
running them (then ``PRAGMA user_version``)."""

#: Migration 9's kept counts of each kind and its index of the spans no block holds as written.
UNDO_9 = ("DROP TRIGGER kind_counts_insert", "DROP TRIGGER kind_counts_update", "DROP TRIGGER kind_counts_delete",
          "DROP TABLE kind_counts", "DROP INDEX span_unblocked")

#: Migration 10's blocks of every sender a pass (``as_schema_9`` first turns them into the blocks schema 9 wrote).
UNDO_10 = ("DROP TRIGGER memory_pass_blocks_pass", "DROP TABLE memory_pass_blocks")


def as_schema_9(db) -> None:
    """Each pass's block of every sender as schema 9 wrote it, a block a sender and source (first values and
    steps), then :data:`UNDO_10`: a file of schema 9 or older holds its memory samples there."""
    import json

    import numpy as np

    from raysleuth.recorder import blocks, deltas

    for high, n, sources, body in db.execute("SELECT pass, n, sources, body FROM memory_pass_blocks").fetchall():
        columns = deltas.decode(body, len(blocks.PASS_COLUMNS), n)
        names = json.loads(sources)
        senders, codes = columns[blocks._SENDER], columns[blocks._SOURCE]
        cuts = np.flatnonzero((np.diff(senders) != 0) | (np.diff(codes) != 0)) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), n]):
            db.execute("INSERT INTO memory_blocks (pass, sender, source, n, body) VALUES (?, ?, ?, ?, ?)",
                       (high, int(senders[a]), names[int(codes[a])], b - a,
                        deltas.encode(columns[:1 + len(blocks.INTS), a:b])))
    for statement in UNDO_10:
        db.execute(statement)
