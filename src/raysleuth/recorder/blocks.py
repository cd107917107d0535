"""Memory samples also kept as columns in blocks, written at ingest (schema 5), for readers of every worker's series.

A thousand ranks sampled every 10 s are 360,000 memory rows an hour; SQLite hands each to Python as a tuple at
about 2 µs, whatever it holds. So the writer's store seals what it wrote into blocks from time to time: a
**pass** takes every memory row of ids ``(lo, hi]`` that :data:`~raysleuth.recorder.schema.SEALED` admits (a
packed sample whose numbers are integers or null) and writes one block of them all (schema 10), its rows by sender,
source and id: their time, id, rank, step, five numbers, sender and source as columns of first values and steps
(:mod:`~raysleuth.recorder.deltas`, each sender's first step kept apart). Before schema 10 a pass wrote a block
per sender and source (zlib before schema 9): a live run's pass holds a few dozen samples of each of a thousand
workers, and a reader paid about 0.1 ms a block. The rows stay as they are; every other reader reads them as before.

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
import json
import os
import zlib
from collections.abc import Iterator
from typing import Any

from raysleuth.recorder import deltas, reading, span_blocks
from raysleuth.recorder.schema import SEALED

__all__ = ["PASS_COLUMNS", "PASS_ROWS", "SEALED", "RssRuns", "beyond", "bucket_rows", "read", "rss_bucket_columns",
           "rss_buckets", "seal", "seal_quietly", "snapshot", "top"]


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
#: The columns of a pass's block of every sender (schema 10), its rows by sender, source and id: the times' bits,
#: the :data:`INTS`, the sender and the source's place in the block's ``sources`` (a JSON list, null first).
PASS_COLUMNS = ("time", *INTS, "sender", "source")
_SENDER, _SOURCE, _RANK = PASS_COLUMNS.index("sender"), PASS_COLUMNS.index("source"), PASS_COLUMNS.index("rank")

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
    # every row read stays alive until its block is written: the collector would walk them again and again for
    # nothing (a tenth of a pass)
    with reading.bulk():
        return _seal(db)


def _seal(db) -> int:
    import numpy as np

    db.execute("BEGIN IMMEDIATE")
    try:
        low = db.execute("SELECT coalesce(max(hi), 0) FROM block_passes").fetchone()[0]
        high = db.execute("SELECT coalesce(max(id), 0) FROM entries").fetchone()[0]
        sealed = 0
        if high > low:
            by_sender: dict[tuple, list] = {}
            for row in db.execute(_SEAL, (low, high, low, high)):
                group = by_sender.get(row[:2])
                if group is None:
                    group = by_sender[row[:2]] = []
                group.append(row)
            keys = sorted(by_sender, key=_block_order)  # by sender, then source
            names = sorted({source for _, source in keys}, key=_source_order)
            code = {source: number for number, source in enumerate(names)}
            rows = [row for key in keys for row in by_sender.pop(key)]
            if rows:
                columns = list(zip(*rows))
                senders = np.array(columns[0], dtype=np.int64)
                sources = np.fromiter(map(code.__getitem__, columns[1]), dtype=np.int64, count=len(rows))
                breaks = np.flatnonzero((np.diff(senders) != 0) | (np.diff(sources) != 0)) + 1  # each run's first
                body = deltas.encode(np.vstack((np.array(columns[2], dtype=np.float64).view(np.int64),
                                                np.array(columns[3:], dtype=np.int64), senders, sources)), breaks)
                db.execute("INSERT INTO memory_pass_blocks (pass, n, sources, body) VALUES (?, ?, ?, ?)",
                           (high, len(rows), json.dumps(names), body))
            sealed = len(rows)
            db.execute("INSERT INTO block_passes (hi, lo) VALUES (?, ?)", (high, low))
            span_blocks.seal(db, low, high)  # the same ids' top-level spans, in the same transaction
        db.commit()
        return sealed
    except BaseException:
        db.rollback()
        raise


def _block_order(key: tuple) -> tuple:
    """A (sender, source)'s place in a pass: by sender, then source (null first, as SQLite orders them)."""
    sender, source = key
    return (sender is not None, sender or 0, *_source_order(source))


def _source_order(source: str | None) -> tuple:
    """A source's place among a pass's sources (null first): a block's ``sources`` list, and :func:`_block_order`'s."""
    return source is not None, source or ""


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


class RssRuns:
    """:func:`rss_bucket_columns`' runs of each block, folded from blocks that another reader decodes in the same
    snapshot (the report's memory verdicts read every block first: :func:`~raysleuth.memory.memory_report`'s
    ``on_block``), so the curves decode none again. Made in that snapshot: it holds the newest pass's top then.
    The reader sets ``whole`` once every sender's samples up to that top went through :meth:`add` (a read of every
    job): only then do the curves take them."""

    def __init__(self, store, width: float, *, start: float) -> None:
        self.width, self.start, self.high = width, start, top(store)
        self.parts: list[tuple] = []
        self.whole = False

    def add(self, sender: int, times, ranks, rss) -> None:
        """One sender's and source's samples (times, ranks and RSS), as :func:`read` gives them: their runs of one
        (rank, bucket), each's rank, bucket, first time and highest RSS (no part where no RSS is held)."""
        import numpy as np

        have = rss != NULL
        if not have.all():
            times, ranks, rss = times[have], ranks[have], rss[have]
        if len(times):
            bucket = ((times - self.start) / self.width).astype(np.int64)  # SQLite's CAST: toward zero
            runs = np.concatenate(([0], np.flatnonzero((np.diff(bucket) != 0) | (np.diff(ranks) != 0)) + 1))
            self.parts.append((sender, ranks[runs], bucket[runs], np.minimum.reduceat(times, runs),
                               np.maximum.reduceat(rss, runs)))


def rss_bucket_columns(store, width: float, *, start: float, runs: RssRuns | None = None) -> tuple | None:
    """``reading.buckets``'s answer for RSS as five numpy columns (rank, pid, bucket, first time, highest value;
    :data:`NULL` for a null rank or pid), in its order, from the blocks and the rows no pass holds: each block's
    runs of one (rank, bucket) with their first time and highest value, then one sort and one cut of them all (the
    least of the firsts, the most of the highest: a bucket a pass split comes together). ``runs``: the blocks'
    runs as another reader folded them (used when ``whole``, of this snapshot's passes, for this ``width`` and
    ``start``). None where they cannot say it exactly: no pass (every row is read by SQLite then), or
    a row whose highest value is not an int64 (a float, a huge value)."""
    import numpy as np

    if not top(store):
        return None
    with snapshot(store):  # the top, the blocks and the rows of one state of the file
        high = top(store)
        pids = {sender: NULL if pid is None else pid
                for sender, pid in store._db.execute("SELECT id, pid FROM senders")}
        if runs is not None and runs.whole and (runs.high, runs.width, runs.start) == (high, width, start):
            folded = runs.parts
        else:  # each sender's runs of one (rank and bucket first: a sender's samples come in id order)
            fold = RssRuns(store, width, start=start)
            for sender, _source, times, (ranks, values) in read(store, high, ints=("rank", "v0")):
                fold.add(sender, times, ranks, values)
            folded = fold.parts
        parts: list[tuple] = [(ranks, np.full(len(ranks), pids.get(sender, NULL), dtype=np.int64), bucket, first,
                               most) for sender, ranks, bucket, first, most in folded]
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


def read(store, high: int, *, job: list[str] | None = None, ints: tuple[str, ...] = INTS,
         floats: tuple[str, ...] = (), ranks: Any = None) -> Iterator[tuple]:
    """Each sender's and source's samples in the blocks of the passes up to ``high``, in pass and id order, by
    sender and source: (sender, source, times as float64, the ``ints`` as a (len(ints), n) int64 array; strided
    views of one array, a row a sample, kept alive by any of them a caller keeps). ``job``: only the senders of
    these Ray jobs; ``ints``: these of the :data:`INTS`, in this order (a block of schema 9 or later decodes no
    other); ``floats``: these of the :data:`INTS` as float64 (:data:`NULL`: NaN), a fifth item, made as each block
    is decoded (a column not in ``ints`` is never kept as ints: the memory reader's five numbers); ``ranks`` (an
    int64 array): of a block of every sender, only the runs of a sender and source that hold one of these ranks
    (``memory --rank 7`` then joins one worker's samples, not every worker's; the caller still picks the samples). A
    pass of schema 10 holds one block of every sender (:data:`PASS_COLUMNS`); an older one, a block a sender and
    source.

    A worker's samples lie in a piece of every pass (a full-mode hour of a thousand ranks: 110 passes, 110,000
    pieces): the pieces are not joined one by one, but every block's runs placed first (sender and source columns
    only), then each block decoded once and put in its place in one array."""
    import numpy as np

    allowed = None if job is None else {sender for (sender,) in store._db.execute(
        f"SELECT id FROM senders WHERE job_id IN ({','.join('?' * len(job))})", job)}
    found: list[tuple] = []  # (body, n, layout): the blocks in pass order
    runs: list[tuple] = []  # per block: its runs' senders, sources (codes into its names), names, starts, lengths
    for sender, source, n, body in store._db.execute(
            "SELECT sender, source, n, body FROM memory_blocks WHERE pass <= ? ORDER BY pass, sender", (high,)):
        if allowed is None or sender in allowed:
            found.append((body, n, False))
            runs.append((np.array([NULL if sender is None else sender]), np.zeros(1, dtype=np.int64), [source],
                         np.zeros(1, dtype=np.int64), np.full(1, n, dtype=np.int64)))
    if store.schema_version >= 10:
        for n, sources, body in store._db.execute(
                "SELECT n, sources, body FROM memory_pass_blocks WHERE pass <= ? ORDER BY pass", (high,)):
            found.append((body, n, True))
            runs.append(_pass_runs(body, n, sources, allowed, ranks))
    if not found:
        return
    keys, joined, ends = _join(found, runs, tuple(INTS.index(name) for name in ints),
                               tuple(INTS.index(name) for name in floats))
    cut = 1 + len(ints)
    for at, (sender, source) in enumerate(keys):
        a, b = (ends[at - 1] if at else 0), ends[at]  # every key has a run: none is empty
        if floats:
            yield (sender, source, joined[a:b, 0].view(np.float64), joined[a:b, 1:cut].T,
                   joined[a:b, cut:].view(np.float64).T)
        else:
            yield sender, source, joined[a:b, 0].view(np.float64), joined[a:b, 1:].T


def _pass_runs(body: bytes, n: int, sources: str, allowed: set | None, ranks: Any) -> tuple:
    """A block of every sender's runs of one sender and source: (senders, sources as codes into the block's source
    names, those names, starts, lengths); only those of the ``allowed`` senders (None: all) that hold one of the
    ``ranks`` (None: any)."""
    import numpy as np

    names = json.loads(sources)
    found = deltas.run_starts(body, len(PASS_COLUMNS), n, (_SENDER, _SOURCE)) if ranks is None else None
    if found is not None:  # off the breaks: each run begins at one (the writer's), no column decoded
        starts, (senders, codes) = found
    else:
        columns = (_SENDER, _SOURCE) if ranks is None else (_SENDER, _SOURCE, _RANK)
        every, every_code, *held = deltas.decode(body, len(PASS_COLUMNS), n, columns)
        starts = np.flatnonzero(np.concatenate(([True], (np.diff(every) != 0) | (np.diff(every_code) != 0))))
        senders, codes = every[starts], every_code[starts]
    lengths = np.diff(np.append(starts, n))
    kept = None if allowed is None else np.isin(senders, np.fromiter(allowed, dtype=np.int64))
    if ranks is not None:  # the rank column read too
        holding = np.add.reduceat(np.isin(held[0], ranks), starts) > 0
        kept = holding if kept is None else kept & holding
    if kept is not None:
        starts, lengths, senders, codes = starts[kept], lengths[kept], senders[kept], codes[kept]
    return senders, codes, names, starts, lengths


def _join(found: list[tuple], runs: list[tuple], wanted: tuple[int, ...], floated: tuple[int, ...] = ()) -> tuple:
    """(keys: every (sender, source) in order, the joined (n, 1 + len(wanted) + len(floated)) int64 array: a row a
    sample, the times' bits, the ``wanted`` ints, then the ``floated`` ones as float64 bits (NaN for :data:`NULL`),
    each key's samples in block order, each key's end in it) of ``found`` blocks (body, n, of every sender) and
    their ``runs``: every run placed first, then each block decoded once, its rows made, and put in their places
    (a sample's row moves as one: a column at a time would place each value apart, at twice the cost)."""
    import numpy as np

    names = sorted({name for _, _, listed, _, _ in runs for name in listed}, key=_source_order)
    code = {name: at for at, name in enumerate(names)}  # the sources' order: _block_order's
    senders = np.concatenate([senders for senders, _, _, _, _ in runs])  # NULL (no sender) first, as None
    codes = np.concatenate([np.array([code[name] for name in listed], dtype=np.int64)[local]
                            for _, local, listed, _, _ in runs])
    lengths = np.concatenate([length for _, _, _, _, length in runs])
    order = np.lexsort((codes, senders))  # the runs in key, then block order (the sort is stable)
    new = np.concatenate(([True], (np.diff(senders[order]) != 0) | (np.diff(codes[order]) != 0)))[:len(order)]
    key_of = np.empty(len(order), dtype=np.int64)
    key_of[order] = np.cumsum(new) - 1
    firsts = order[new]
    keys = [(None if sender == NULL else sender, names[source]) for sender, source in
            zip(senders[firsts].tolist(), codes[firsts].tolist())]
    places = np.empty(len(order), dtype=np.int64)  # where each run begins in the joined array
    places[order] = np.concatenate(([0], np.cumsum(lengths[order])[:-1]))
    ints = 1 + len(wanted)
    joined = np.empty((int(lengths.sum()), ints + len(floated)), dtype=np.int64)
    decoded = (*wanted, *(at for at in floated if at not in wanted))  # each column decoded once
    made: Any = [1 + decoded.index(at) for at in floated]
    if made and made == list(range(made[0], made[0] + len(made))):
        made = slice(made[0], made[0] + len(made))  # the float columns side by side: a view, not a copy
    whole, most = np.dtype((np.void, 8 * joined.shape[1])), max(n for _, n, _ in found)
    buffer, block_rows = np.empty((1 + len(decoded), most), dtype=np.int64), np.empty((most, joined.shape[1]), np.int64)
    first = 0
    for (body, n, every), (_, _, _, starts, length) in zip(found, runs):
        columns = deltas.decode(body, len(PASS_COLUMNS), n, (0, *(1 + at for at in decoded)), buffer) if every \
            else _old_block(body, n, decoded)
        here, size = places[first:first + len(starts)], int(length.sum())
        if size < n:  # some runs only: theirs
            columns = columns[:, np.repeat(starts - np.cumsum(length) + length, length) + np.arange(size)]
        rows = joined if len(found) == 1 and size == n else block_rows[:size]  # reused: nothing new to fault in
        rows[:, :ints] = columns[:ints].T
        if floated:
            numbers, values = rows[:, ints:].view(np.float64), columns[made]
            numbers[:] = values.T
            if values.size and values.min() == NULL:  # NULL is the least int64
                numbers[(values == NULL).T] = np.nan
        if rows is not joined:  # each row one item (8 bytes a column): numpy's put copies it whole, not value by value
            np.put(joined.view(whole).reshape(-1), np.repeat(here - np.cumsum(length) + length, length)
                   + np.arange(size), rows.view(whole).reshape(-1))
        first += len(starts)
    ends = np.cumsum(np.bincount(key_of, weights=lengths, minlength=len(keys)).astype(np.int64)).tolist()
    return keys, joined, ends


def _old_block(body: bytes, n: int, wanted: tuple[int, ...]) -> Any:
    """A block of one sender and source (before schema 10) as one (1 + len(wanted), n) int64 array: the times'
    bits, then the wanted :data:`INTS`."""
    import numpy as np

    if body[:1] == deltas.ZLIB:  # a block written before schema 9
        raw = zlib.decompress(body)
        every = np.frombuffer(raw, dtype=np.int64, offset=8 * n).reshape(len(INTS), n)
        return np.vstack((np.frombuffer(raw, dtype=np.int64, count=n), every[list(wanted)]))
    return deltas.decode(body, 1 + len(INTS), n, (0, *(1 + at for at in wanted)))
