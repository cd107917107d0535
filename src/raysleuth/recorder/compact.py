"""Each collectives dump's entries, taken out once at ingest: the matcher's input without parsing the dump again.

``collectives --run``, ``stacks`` and the report read each worker's newest dump, parse it whole, cut its arrays
to the newest :data:`~raysleuth.evidence.entries.ENTRIES_PER_GROUP` per group and turn them into
:class:`~raysleuth.evidence.entries.Entry` objects (0.65 s for the thousand 48 KB dumps of a 1,000-rank
hour). A dump is written once and read many times, so the writer's store does that work once, in a pass
(:class:`Passes`: at most every :data:`PASS_SECONDS` while dumps wait, and at close). Of each worker's dumps
since the last pass it takes the newest (the only one a reader reads): parses it as a reader does
(``reading.loads``), cuts its arrays as ``reading.tails`` does, takes its entries
(``evidence.entries.entries_from_dump``) and keeps the dump without its arrays (``rest``) and its entries as
rows, as JSON in ``collective_entries`` (schema 6) under the dump's id, with :data:`FORMAT` and the cut. A
reader (:func:`read`) takes a dump from there when both match its own, and parses the others as before;
writing, changing or removing a dump drops its row (SQLite triggers). JSON, not a pickle: nothing read from
disk is unpickled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from raysleuth.evidence.entries import ENTRIES_PER_GROUP, Entry, entries_from_dump
from raysleuth.recorder.reading import _cut_arrays, _rows, loads, put_back

__all__ = ["FORMAT", "Passes", "body", "entries_of", "read", "seal", "seal_quietly"]

#: What a row's entries mean: raise it when ``entries_from_dump`` or the cut changes what it answers (a reader
#: then parses the dumps of older rows itself).
FORMAT = 1
#: The arrays a dump's entries come from, as ``reading.tails`` names them.
ARRAYS = ("calls", "flight_recorder.entries")
_PATHS = [path.split(".") for path in ARRAYS]
#: Dumps one pass reads at most (a file of an older raysleuth holds thousands): the rest wait for the next pass.
PASS_DUMPS = 20_000
#: Seconds between two passes of a writer: a full-mode rank dumps every second while its positions change, and
#: only a worker's newest dump is read, so a pass takes the newest of each worker and marks the others taken.
PASS_SECONDS = 2.0
_FIELDS = ("seq", "op", "inputs", "state", "created", "file", "line", "function", "step", "call")


def body(text: Any, keep: int = ENTRIES_PER_GROUP) -> str | None:
    """The stored form of one dump's ``data`` text: ``{"rest": the dump without its arrays, "entries": {group:
    [[seq, op, inputs, state, created, file, line, function, step, call], ...]}}``, each group's entries in the
    order ``entries_from_dump`` gives them; None when the dump is not a JSON object (a reader keeps it whole).

    ``json`` writes it in ASCII (NaN and ints past 64 bits as they are, which ``reading.loads`` reads back
    exactly; a lone surrogate escaped, which SQLite could not store as text)."""
    if not isinstance(text, str):
        return None
    _, data, found = _cut_arrays((text,), 0, ARRAYS, _PATHS, keep)
    if not isinstance(data, dict):
        return None
    rest = json.dumps(data, separators=(",", ":"))  # before the arrays go back in, as tail_records puts them
    put_back(data, found)
    entries = {group: [[getattr(entry, name) for name in _FIELDS] for entry in by_seq.values()]
               for group, by_seq in entries_from_dump(data).items()}
    return '{"rest":' + rest + ',"entries":' + json.dumps(entries, separators=(",", ":")) + "}"


def entries_of(stored: dict[str, Any]) -> dict[str, dict[int, Entry]]:
    """A stored body's entries as ``entries_from_dump`` gave them."""
    return {group: {row[0]: Entry(*row) for row in rows} for group, rows in stored["entries"].items()}


def seal(db) -> int:
    """Take the entries of the dumps written since the last pass (at most :data:`PASS_DUMPS`, oldest first): of
    each writer's (rank and sender), the newest only, the others marked taken with no body (no reader reads
    them: ``newest_per_worker``; were one read, it is parsed). Returns how many dumps the pass read."""
    high = db.execute("SELECT coalesce(max(id), 0) FROM collective_entries").fetchone()[0]
    rows = db.execute("SELECT id, rank, sender, time FROM entries WHERE kind = 'collectives' AND id > ? ORDER BY id "
                      "LIMIT ?", (high, PASS_DUMPS)).fetchall()
    newest: dict[tuple, tuple] = {}
    for dump_id, rank, sender, when in rows:
        key = (rank, sender)
        if key not in newest or (when, dump_id) >= newest[key]:
            newest[key] = (when, dump_id)
    wanted = {dump_id for _, dump_id in newest.values()}
    written = []
    for dump_id, *_ in rows:
        stored = None
        if dump_id in wanted:
            try:
                text = db.execute("SELECT data FROM entries WHERE id = ?", (dump_id,)).fetchone()[0]
                stored = body(text)
            except Exception:  # a dump the matcher's reader would also trip on: it reads that one itself
                stored = None
        written.append((dump_id, FORMAT, ENTRIES_PER_GROUP, stored))
    with db:
        db.executemany("INSERT OR REPLACE INTO collective_entries (id, format, keep, body) VALUES (?, ?, ?, ?)",
                       written)
    return len(written)


def seal_quietly(db) -> int:
    """:func:`seal`, never raising: the rows are committed already, and a reader parses what no pass took."""
    try:
        return seal(db)
    except Exception:
        try:
            db.rollback()
        except Exception:
            pass
        return 0


class Passes:
    """When a writer's store makes a pass: at most every :data:`PASS_SECONDS` while dumps wait, and at close."""

    def __init__(self) -> None:
        self.waiting = False
        self.last = float("-inf")  # the first batch with dumps passes (not: monotonic() past PASS_SECONDS)

    def after(self, db, dumps: bool) -> None:
        """After a committed batch (``dumps``: it held collectives dumps); the caller holds the writer's lock."""
        self.waiting = self.waiting or dumps
        if self.waiting and time.monotonic() - self.last >= PASS_SECONDS:
            self.close(db)

    def close(self, db) -> None:
        """A pass now, if dumps wait."""
        if self.waiting:
            seal_quietly(db)
            self.waiting, self.last = False, time.monotonic()


def read(store, ids: Sequence[int], columns: Sequence[str]) -> dict[int, tuple[dict[str, Any], dict[str, Any]]]:
    """Per id of ``ids`` whose dump a pass took with this reader's :data:`FORMAT` and cut: its record as
    ``reading.tail_records`` gives it once its arrays are dropped (``Record.to_dict()`` of its row ``(id,) +
    columns``, ``data`` the dump without its arrays), and its stored body parsed (``rest``, ``entries``). Files
    before schema 6 hold none."""
    if store.schema_version < 6 or not ids:
        return {}
    selected = ", ".join("''" if column == "data" else f"r.{column}" for column in columns)
    found: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    for start in range(0, len(ids), 5000):
        chunk = list(ids[start:start + 5000])
        sql = (f"SELECT r.id, {selected}, c.body FROM collective_entries c JOIN records r ON r.id = c.id "
               f"WHERE c.id IN ({','.join('?' * len(chunk))}) AND c.format = ? AND c.keep = ? AND c.body IS NOT NULL")
        for row in _rows(store, sql, [*chunk, FORMAT, ENTRIES_PER_GROUP]):
            stored = loads(row[-1])
            if isinstance(stored, dict) and isinstance(stored.get("rest"), dict) and "entries" in stored:
                record = store._record(row[:-1]).to_dict()
                record["data"] = stored["rest"]
                found[row[0]] = (record, stored)
    return found
