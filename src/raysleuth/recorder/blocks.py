"""Memory samples also kept as columns in blocks, written at ingest (schema 5), for readers of every worker's series.

A thousand ranks sampled every 10 s are 360,000 memory rows an hour; SQLite hands each to Python as a tuple at
about 2 µs, whatever it holds. So the writer's store seals what it wrote into blocks from time to time: a
**pass** takes every memory row of ids ``(lo, hi]`` that :data:`~raysleuth.recorder.schema.SEALED` admits (a
packed sample whose numbers are integers or null) and writes one block per sender and source, its samples'
time, id, rank, step and five numbers as columns of first values and steps (:mod:`~raysleuth.recorder.deltas`;
zlib before schema 9). The rows stay as they are; every other reader reads them as before.

A reader of the samples (:func:`raysleuth.memory.workers.memory_report`) reads, in one snapshot, the blocks of
every pass, then row by row only what no pass holds: the rows above the newest pass's top, and those at or
below it that ``SEALED`` leaves out (through migration 5's ``memory_loose`` index). Migration 5's triggers
drop a pass and every later one when a memory row at or below its top is written, changed or removed, so a
block never holds a stale copy: those rows are read row by row again.

The same pass keeps the top-level spans of its ids as one more block (:mod:`raysleuth.recorder.span_blocks`,
schema 7), in the same transaction. A pass costs the writer about 0.1 s for 32,000 samples. One that fails
leaves the rows to be read row by row and never fails the batch that was being stored.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Iterator
from typing import Any

from raysleuth.recorder import deltas, reading, span_blocks
from raysleuth.recorder.schema import SEALED

__all__ = ["PASS_ROWS", "SEALED", "beyond", "bucket_rows", "read", "rss_bucket_columns", "rss_buckets", "seal",
           "seal_quietly", "snapshot", "top"]


def _pass_rows() -> int:
    try:
        return max(1, int(os.environ.get("RAYSLEUTH_SEAL_ROWS", "32768")))
    except ValueError:  # never the writer's error: the default
        return 32_768


#: Memory rows written since the last pass that start the next (1,000 ranks: every 5 minutes in light mode);
#: ``RAYSLEUTH_SEAL_ROWS`` in the writer's environment sets it.
PASS_ROWS = _pass_rows()
#: A block's null (SEALED leaves out a row holding this value).
NULL = -(2**63)
#: The integer columns of a block, in order, after its times.
INTS = ("id", "rank", "step", "v0", "v1", "v2", "v3", "v4")

#: The rows of a pass, in id order (grouped in Python: SQLite's sort cost a fifth more), read by id: SQLite
#: would otherwise walk the index of every memory row the run holds to test each one's id (reading the rows of a
#: 1,000-rank hour's last pass: 0.16 s against 0.09 s, and growing with the run). A null comes as :data:`NULL`
#: (``SEALED`` admits no row holding that value), so each column goes into its array as it is. ``SEALED`` is read
#: off migration 5's ``memory_loose`` index, which holds exactly the memory rows it leaves out (SQLite tested each
#: row once, when it was written): the few of the pass's ids there, not the test on every row (a quarter less).
_SEAL = ("SELECT sender, v5, time, " + ", ".join(f"coalesce({column}, {NULL})" for column in INTS) +
         " FROM entries NOT INDEXED WHERE id > ? AND id <= ? AND kind = 'memory' AND id NOT IN (SELECT id FROM "
         f"entries INDEXED BY memory_loose WHERE kind = 'memory' AND NOT ({SEALED}) AND id > ? AND id <= ?)")


def seal(db) -> int:
    """One pass over what was written since the last (a writer's connection, outside a transaction; the store's
    lock held): the samples it sealed."""
    import numpy as np

    db.execute("BEGIN IMMEDIATE")
    try:
        low = db.execute("SELECT coalesce(max(hi), 0) FROM block_passes").fetchone()[0]
        high = db.execute("SELECT coalesce(max(id), 0) FROM entries").fetchone()[0]
        sealed = 0
        if high > low:
            written = []
            by_sender: dict[tuple, list] = {}
            for row in db.execute(_SEAL, (low, high, low, high)):
                group = by_sender.get(row[:2])
                if group is None:
                    group = by_sender[row[:2]] = []
                group.append(row)
            for (sender, source), group in sorted(by_sender.items(), key=_block_order):  # by sender, source
                columns = list(zip(*group))
                times = np.array(columns[2], dtype=np.float64).view(np.int64)
                written.append((high, sender, source, len(times),
                                deltas.encode(np.vstack((times, np.array(columns[3:], dtype=np.int64))))))
                sealed += len(times)
            db.executemany("INSERT INTO memory_blocks (pass, sender, source, n, body) VALUES (?, ?, ?, ?, ?)",
                           written)
            db.execute("INSERT INTO block_passes (hi, lo) VALUES (?, ?)", (high, low))
            span_blocks.seal(db, low, high)  # the same ids' top-level spans, in the same transaction
        db.commit()
        return sealed
    except BaseException:
        db.rollback()
        raise


def _block_order(item: tuple) -> tuple:
    """A block's place in its pass: by sender, then source (null first, as SQLite orders them)."""
    sender, source = item[0]
    return (sender is not None, sender or 0, source is not None, source or "")


def seal_quietly(db) -> int:
    """:func:`seal`, where one that fails leaves its rows to be read one by one (never the writer's error): 0."""
    try:
        seal(db)
    except Exception:
        pass
    return 0


def top(store) -> int:
    """The newest pass's top id (0: no pass, or a file before schema 5): every row ``SEALED`` admits at or below
    it is in a block."""
    if store.schema_version < 5:
        return 0
    return store._db.execute("SELECT coalesce(max(hi), 0) FROM block_passes").fetchone()[0]


@contextlib.contextmanager
def snapshot(store) -> Iterator[None]:
    """Reads inside see one state of the file (a read transaction), so a pass the writer commits meanwhile
    neither hides rows nor shows them twice."""
    db = store._db
    if db.in_transaction or not store.readonly:  # a writer's connection: its own passes wait for its lock
        yield
        return
    db.execute("BEGIN")
    try:
        yield
    finally:
        db.rollback()  # nothing was written: ends the read


def beyond(high: int) -> list[tuple[str, list[Any]]]:
    """The SQL conditions (with their arguments) of the rows a reader of the blocks up to ``high`` still reads row
    by row: above the top, and at or below it those the passes left out (spelled as the ``memory_loose`` index)."""
    if not high:
        return [("1", [])]
    return [("id > ?", [high]),
            (f"id IN (SELECT id FROM entries INDEXED BY memory_loose WHERE kind = 'memory' AND NOT ({SEALED}) "
             "AND id <= ?)", [high])]


def rss_buckets(store, width: float, *, start: float) -> Iterator[tuple]:
    """``reading.buckets(store, "memory", "rss_bytes", width, start=start)``, the same tuples in the same order, from
    the blocks and the rows no pass holds (the report's memory curves): :func:`rss_bucket_columns` a row at a time,
    or SQLite's own answer where those columns cannot say it."""
    columns = rss_bucket_columns(store, width, start=start)
    if columns is None:
        yield from reading.buckets(store, "memory", "rss_bytes", width, start=start)
        return
    yield from bucket_rows(columns)


def bucket_rows(columns: tuple) -> Iterator[tuple]:
    """:func:`rss_bucket_columns`' arrays as ``reading.buckets``' tuples (None for :data:`NULL`)."""
    ranks, pid, bucket, first, value = columns
    for rank, who, at, when, most in zip(ranks.tolist(), pid.tolist(), bucket.tolist(), first.tolist(),
                                         value.tolist()):
        yield (None if rank == NULL else rank, None if who == NULL else who, at, when, most)


def rss_bucket_columns(store, width: float, *, start: float) -> tuple | None:
    """``reading.buckets``'s answer for RSS as five numpy columns (rank, pid, bucket, first time, highest value;
    :data:`NULL` for a null rank or pid), in its order, from the blocks and the rows no pass holds: each block's
    runs of one (rank, bucket) with their first time and highest value, then one sort and one cut of them all (the
    least of the firsts, the most of the highest: a bucket a pass split comes together). None where they cannot
    say it exactly: no pass (every row is read by SQLite then), or a row whose highest value is not an int64 (a
    float, a huge value)."""
    import numpy as np

    if not top(store):
        return None
    parts: list[tuple] = []
    with snapshot(store):  # the top, the blocks and the rows of one state of the file
        high = top(store)
        pids = {sender: NULL if pid is None else pid
                for sender, pid in store._db.execute("SELECT id, pid FROM senders")}
        for sender, _source, times, ints in read(store, high, ints=("rank", "v0")):  # each block's runs of one
            ranks, values = ints  # rank and bucket first (a block is one sender's samples in id order: a few runs)
            have = values != NULL
            if not have.all():
                times, ranks, values = times[have], ranks[have], values[have]
            if not len(times):
                continue
            bucket = ((times - start) / width).astype(np.int64)  # SQLite's CAST: toward zero
            runs = np.concatenate(([0], np.flatnonzero((np.diff(bucket) != 0) | (np.diff(ranks) != 0)) + 1))
            parts.append((ranks[runs], np.full(len(runs), pids.get(sender, NULL), dtype=np.int64), bucket[runs],
                          np.minimum.reduceat(times, runs), np.maximum.reduceat(values, runs)))
        rows = [row for clause in beyond(high)
                for row in reading.buckets(store, "memory", "rss_bytes", width, start=start, clause=clause,
                                           by_id=True)]
    if any(type(row[4]) is not int or not NULL < row[4] < -NULL or type(row[0] or 0) is not int
           or type(row[1] or 0) is not int for row in rows):  # a float or a huge value: SQLite's own answer
        return None
    if rows:
        columns = list(zip(*rows))
        parts.append(tuple(np.array([NULL if v is None else v for v in column], dtype=np.int64) for column in
                           columns[:3]) + (np.array(columns[3], dtype=float), np.array(columns[4], dtype=np.int64)))
    if not parts:
        return tuple(np.empty(0, dtype=dtype) for dtype in (np.int64, np.int64, np.int64, float, np.int64))
    ranks, pid, bucket, times, values = (np.concatenate(column) for column in zip(*parts))
    if not len(ranks):
        return ranks, pid, bucket, times, values
    order = np.lexsort((bucket, pid, ranks))  # SQLite's ORDER BY rank, pid, bucket: null (NULL here) first
    ranks, pid, bucket, times, values = ranks[order], pid[order], bucket[order], times[order], values[order]
    cuts = np.flatnonzero((np.diff(ranks) != 0) | (np.diff(pid) != 0) | (np.diff(bucket) != 0)) + 1
    starts = np.concatenate(([0], cuts))
    return (ranks[starts], pid[starts], bucket[starts], np.minimum.reduceat(times, starts),
            np.maximum.reduceat(values, starts))


def read(store, high: int, *, job: list[str] | None = None,
         ints: tuple[str, ...] = INTS) -> Iterator[tuple[int, str | None, Any, Any]]:
    """Each block of the passes up to ``high``: (sender, source, times as float64, the :data:`INTS` as an 8×n
    int64 array). ``job``: only the senders of these Ray jobs; ``ints``: only these of the :data:`INTS`, in this
    order (a block of schema 9 decodes no other)."""
    import numpy as np

    wanted = tuple(INTS.index(name) for name in ints)
    sql = "SELECT sender, source, n, body FROM memory_blocks WHERE pass <= ?"
    args: list[Any] = [high]
    if job is not None:
        sql += f" AND sender IN (SELECT id FROM senders WHERE job_id IN ({','.join('?' * len(job))}))"
        args += job
    for sender, source, n, body in store._db.execute(sql + " ORDER BY pass, sender", args):
        if body[:1] == _ZLIB:  # a block written before schema 9
            raw = zlib.decompress(body)
            every = np.frombuffer(raw, dtype=np.int64, offset=8 * n).reshape(len(INTS), n)
            yield sender, source, np.frombuffer(raw, dtype=np.float64, count=n), \
                every if ints == INTS else every[list(wanted)]
        else:
            columns = deltas.decode(body, 1 + len(INTS), n, (0, *(1 + at for at in wanted)))
            yield sender, source, columns[0].view(np.float64), columns[1:]


#: How a block written before schema 9 begins: a zlib stream of the times, then the :data:`INTS`.
_ZLIB = b"\x78"
