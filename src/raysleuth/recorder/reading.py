"""The fast read path: only the columns and data fields a reader needs, read in SQL, streamed.

:meth:`EvidenceStore.query` builds a :class:`~raysleuth.recorder.store.Record`
and parses the whole JSON ``data`` of every row (about 15 µs a row); a
reader that needs four numbers of each of a million memory samples pays
that a million times. :func:`select` asks SQLite for the named columns and
``data`` fields instead (``json_extract``, in C) and yields plain tuples
from a cursor, a batch at a time, so memory stays bounded whatever the run's
size.

What a field reads back as: a JSON number, string or null as the same
Python value :func:`json.loads` gives; ``true``/``false`` as ``1``/``0``;
an object or a list as its JSON text. A field named ``"name:json"`` reads
as JSON text whatever it holds (:func:`loads` gives the exact value back);
``"name:number"`` reads a JSON number as itself and anything else as None. A row
whose ``data`` is not valid JSON (another writer's) reads as missing
fields, as :meth:`~EvidenceStore.query` reads it as ``{"raw": text}``.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from orjson import loads as _fast_loads

from raysleuth.errors import StoreCorrupt, UsageError
from raysleuth.recorder.allocator import keep_freed_memory
from raysleuth.recorder.schema import COPIED, COPY_MARK, LOG_SEVERE, PACKED, VALUE_COLUMNS

__all__ = ["buckets", "bulk", "loads", "table_for", "newest_per_worker", "select", "senders", "tail_records", "tails",
           "where_clause"]

#: Columns a reader may name (the records table's own).
READABLE = ("id", "kind", "time", "rank", "step", "phase", "name", "level", "data", "seq", "world_size", "node_id",
            "node_ip", "hostname", "pid", "actor_id", "actor_name", "actor_class", "client_id", "job_id", "sender",
            "stored") + VALUE_COLUMNS
#: Columns the rows themselves hold (``entries``, schema 3 on): a read of only these skips the view's join, and
#: its ``data`` reconstruction. ``sender``: the row's number in ``senders`` (schema 3 on, readable there alone);
#: ``stored``: ``data`` as the row holds it (``''`` where the kind's template sits in the value columns,
#: :data:`schema.PACKED`); ``v0``..``v5``: those columns (schema 4 on; None before), with the rows' own columns
#: only (:func:`senders` gives each sender's identity).
_OWN_ONLY = frozenset(("sender", "stored") + VALUE_COLUMNS)
_OWN = frozenset(("id", "kind", "time", "rank", "step", "phase", "name", "level", "seq")) | _OWN_ONLY
ORDERS = {"time": "time, id", "rank": "rank, time, id", "id": "id", None: ""}
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _listed(value: Any) -> list:
    return [value] if isinstance(value, (str, int)) else list(value)


def where_clause(*, kind=None, rank=None, job=None, name=None, since=None, until=None, after_id=None, step_min=None,
                 step_max=None, levels: Iterable[str] | None = None, ids: Iterable[int] | None = None,
                 severe_logs: bool = False) -> tuple[list[str], list[Any]]:
    """SQL conditions and their arguments for the store's filters (shared by ``query`` and :func:`select`).

    ``levels``: the level column is one of these, as spelled. ``severe_logs``: logs that may be warnings or errors
    (:data:`~raysleuth.recorder.schema.LOG_SEVERE`, spelled as migration 8's index, which SQLite then reads)."""
    where: list[str] = [f"({LOG_SEVERE})"] if severe_logs else []
    args: list[Any] = []
    for values, column in ((kind, "kind"), (rank, "rank"), (job, "job_id"), (levels, "level"), (ids, "id")):
        if values is not None:
            listed = _listed(values)
            where.append(f"{column} IN ({','.join('?' * len(listed))})")
            args += listed
    for value, clause in ((name, "name = ?"), (since, "time >= ?"), (until, "time <= ?"), (after_id, "id > ?"),
                          (step_min, "step >= ?"), (step_max, "step <= ?")):
        if value is not None:
            where.append(clause)
            args.append(value)
    return where, args


def _packs(store) -> bool:
    """Whether ``store``'s file may keep rows' data in value columns (schema 4 on, :data:`schema.PACKED`)."""
    return store.schema_version >= 4


def _field_sql(field: str, guarded: bool = True, packed: bool = False, packed_sql: str = "packed") -> str:
    """SQL reading one ``data`` field; ``guarded``: a row whose data is not JSON reads as NULL (one more parse a
    field, so :func:`select` first tries without and asks again guarded only if SQLite met such a row);
    ``packed``: the file keeps some rows' data in value columns (schema 4, :data:`schema.PACKED`), read there."""
    path, _, form = field.partition(":")
    if not _FIELD.match(path) or form not in ("", "json", "number"):
        raise UsageError(f"data field {field!r} cannot be read in SQL", fix="name fields as word.word[:json|:number]")
    value = f"json_extract(data, '$.{path}')"
    if form == "json":
        value = f"json_quote({value})"
    elif form == "number":
        value = f"CASE WHEN json_type(data, '$.{path}') IN ('integer', 'real') THEN {value} END"
    value = f"CASE WHEN json_valid(data) THEN {value} END" if guarded else value
    if not packed:
        return value
    slots = [f"WHEN '{kind}' THEN {VALUE_COLUMNS[template.index(path)]}" for kind, template in PACKED.items()
             if path in template]
    stored = f"CASE kind {' '.join(slots)} END" if slots else "NULL"
    # a field also kept in a value column (schema.COPIED) is read there, where the row's mark says it was kept
    copies = [(kind, VALUE_COLUMNS[fields.index(path)]) for kind, fields in COPIED.items()
              if path in fields and form != "json"]  # json: the JSON text's own spelling
    if form == "json":
        stored = f"json_quote({stored})"
    elif form == "number":
        stored = f"CASE WHEN typeof({stored}) IN ('integer', 'real') THEN {stored} END"
    copied = "".join(f" WHEN kind = '{kind}' AND {VALUE_COLUMNS[-1]} = {COPY_MARK} THEN " +
                     (f"CASE WHEN typeof({column}) IN ('integer', 'real') THEN {column} END" if form == "number"
                      else column) for kind, column in copies)
    return f"CASE WHEN {packed_sql} THEN {stored}{copied} ELSE {value} END"


def select(store, kind: str | Iterable[str] | None, columns: Sequence[str] = ("time",), fields: Sequence[str] = (), *,
           order: str | None = "time", newest_first: bool = False, limit: int | None = None, batch: int = 20_000,
           clause: tuple[str, list] | None = None, by_id: bool = False, **filters: Any) -> Iterator[tuple]:
    """Yield ``columns + fields`` of each matching record of ``store`` (an open ``EvidenceStore``).

    ``fields`` are paths into ``data`` (``"rss_bytes"``, ``"request.id"``). ``order``: ``"time"`` (time, id),
    ``"rank"`` (rank, time, id: one rank's records together), ``"id"`` or ``None``. ``filters``: those of
    :func:`where_clause`; ``clause``: one more (SQL, arguments). A run recorded before job ids reads ``job_id``
    as None and matches no ``job`` filter. A read of the rows' own columns only (:data:`_OWN`: no identity, no
    ``data``) reads the rows' table, not the view (schema 3 on: about a fifth less CPU for the 1,000-rank
    hour's 360,000 memory samples, no join); ``sender`` is readable there alone. ``by_id``: the ``clause`` picks
    a few rows by their ids (:func:`raysleuth.recorder.blocks.beyond`), so SQLite reads them by id instead of
    walking every row of the kind in its index to test each (0.03 s for 360,000 samples).
    """
    unknown = [column for column in columns if column not in READABLE]
    if unknown:
        raise UsageError(f"no column {unknown[0]!r} in the records table", fix=f"use one of {', '.join(READABLE)}")
    old, packed = store.schema_version < 2, _packs(store)
    if old and filters.get("job") is not None:
        return
    own = store.schema_version >= 3 and _OWN.issuperset(columns)
    only = next((column for column in columns if column in _OWN_ONLY), None)
    if only is not None and not own:
        raise UsageError(f"the column {only!r} is read with the rows' own columns only, from a schema 3 file on",
                         fix=f"read it with {', '.join(sorted(_OWN))}")
    job = filters.pop("job", None) if own else None
    where, args = where_clause(kind=kind, **filters)
    if job is not None:
        jobs = _listed(job)
        where.append(f"sender IN (SELECT id FROM senders WHERE job_id IN ({','.join('?' * len(jobs))}))")
        args += jobs
    if clause is not None:
        where, args = where + [clause[0]], args + clause[1]
    if by_id:
        where = [_by_id(term) for term in where]
    table, flag = ("entries", "data = ''") if own else ("records", "packed")

    def sql(guarded: bool) -> str:
        parts = ["NULL" if (old and column == "job_id") or (not packed and column in VALUE_COLUMNS)
                 else "data" if column == "stored" else column for column in columns]
        fielded = [_field_sql(f, guarded, packed, flag) for f in fields]
        text = f"SELECT {', '.join(parts + fielded) or '1'} FROM {table}"
        if where:
            text += " WHERE " + " AND ".join(where)
        if ORDERS[order]:
            text += " ORDER BY " + ", ".join(f"{term} DESC" for term in ORDERS[order].split(", ")) if newest_first \
                else " ORDER BY " + ORDERS[order]
        return text + (f" LIMIT {int(limit)}" if limit is not None else "")

    done = 0
    try:
        try:
            for row in _rows(store, sql(not fields), args, batch, malformed=_Malformed if fields else None):
                done += 1
                yield row
        except _Malformed:  # a row that is not JSON (another writer's): the same query, guarded, from where it was
            yield from itertools.islice(_rows(store, sql(True), args, batch), done, None)
    except OverflowError:
        raise UsageError("a number in the query is too large for the evidence store",
                         fix="pass ranks, steps and ids as they appear in the records") from None


class _Malformed(Exception):
    """SQLite met a ``data`` that is not JSON while reading fields without the guard."""


_command_line = False
_one_shot = False


def command_line_process() -> None:
    """This process is the ``raysleuth`` command line (its console script, ``python -m raysleuth``), not a
    program that calls ``raysleuth.cli.main`` and lives on."""
    global _command_line
    _command_line = True


def one_shot() -> None:
    """A reading command of the command line: the process answers once and exits, so what a :func:`bulk` read
    leaves alive stays alive until then. At the read's end those objects are frozen (``gc.freeze``: never walked
    by the collector again) instead of walked once more per generation they climb (measured: 0.3-0.45 s of CPU
    after reading the 1,000-rank hour's dumps). Only in :func:`command_line_process`: a process that lives on
    (the writer, a job, a test calling ``main``) keeps its collector as it is."""
    global _one_shot
    _one_shot = _command_line
    if _command_line:  # and what it frees is kept for its next arrays (recorder.allocator)
        keep_freed_memory()


@contextlib.contextmanager
def bulk() -> Iterator[None]:
    """While a reader builds many small objects that all stay alive (a dict per entry of a thousand dumps, a
    thousand workers' columns): no cyclic garbage collection, which would walk every one of them again and
    again (measured: 60% of the collectives matcher's input at 1,000 ranks). Collection resumes after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if _one_shot:
                gc.freeze()
            gc.enable()


def senders(store, columns: Sequence[str]) -> dict[int, tuple] | None:
    """Each sender's ``columns`` (identity columns: ``pid``, ``node_ip``...) by its number, for rows read with
    their ``sender`` (:func:`select`'s own columns: no view join a row); None before schema 3 (rows carry them)."""
    if store.schema_version < 3:
        return None
    unknown = [column for column in columns if column not in READABLE or column in _OWN]
    if unknown:
        raise UsageError(f"no identity column {unknown[0]!r} in senders", fix="name identity columns (pid, node_ip...)")
    return {row[0]: row[1:] for row in _rows(store, f"SELECT id, {', '.join(columns)} FROM senders", [])}


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG, _LONG_NEGATIVE = b"0" * 20, b"-" + b"0" * 19


def loads(value: str | None, default: Any = None) -> Any:
    """A ``"name:json"`` field as Python again (``default`` when the row had no such field, or it is not JSON).

    orjson parses it (48 MB of dumps' entries: 0.23 s with the check, 0.47 s for ``json``); ``json`` what
    orjson reads otherwise or refuses, so the value is ``json.loads``'s: a run of 20 digits or a minus and 19
    (an int outside [-2**63, 2**64) is a float to orjson; found in C), ``NaN`` and ``Infinity``.
    """
    if value is None:
        return default
    try:
        raw = value.encode() if type(value) is str else value
        digits = raw.translate(_DIGITS_AS_ZERO)
        if _LONG not in digits and _LONG_NEGATIVE not in digits:
            return _fast_loads(raw)
    except (ValueError, TypeError, AttributeError):  # orjson's JSONDecodeError and UnicodeError are ValueErrors
        pass
    try:
        return json.loads(value)
    except ValueError:
        return default


# ------------------------------------------------------------ aggregates in SQL


def table_for(store, job: Any = None) -> str:
    """The table an aggregate reads: the rows alone (``store.rows_table``: SQLite keeps the ``records`` view's
    join in an aggregate) unless a ``job`` filter needs the sender's column."""
    return store.rows_table if job is None else "records"


def _by_id(term: str) -> str:
    """A condition on the kind written so that SQLite uses no index for it (``+kind``): the rows are found by id."""
    return "+" + term if term.startswith("kind ") else term


def buckets(store, kind: str, field: str, width: float, *, start: float, clause=("1", []),
            by_id: bool = False) -> Iterator[tuple]:
    """(rank, pid, bucket, first time, highest value) of a numeric field per worker and ``width`` s (clause and
    ``by_id``: :func:`select`'s)."""
    if not _FIELD.match(field):
        raise UsageError(f"data field {field!r} cannot be read in SQL", fix="name fields as word.word")
    value = _field_sql(f"{field}:number", True, _packs(store))
    sql = (f"SELECT rank, pid, CAST((time - ?) / ? AS INTEGER) AS bucket, MIN(time), MAX({value}) FROM records WHERE "
           f"{_by_id('kind = ?') if by_id else 'kind = ?'} AND {value} IS NOT NULL AND {clause[0]} "
           "GROUP BY rank, pid, bucket ORDER BY rank, pid, bucket")
    yield from _rows(store, sql, [start, width, kind, *clause[1]])


def _rows(store, sql: str, args: list, batch: int = 20_000, malformed: type[Exception] | None = None) -> Iterator[tuple]:
    try:
        cursor = store._db.execute(sql, args)
        while rows := cursor.fetchmany(batch):
            yield from rows
    except sqlite3.DatabaseError as error:
        if malformed is not None and "malformed JSON" in str(error):
            raise malformed() from None
        raise StoreCorrupt(f"{store.path} could not be read ({error})",
                           fix="move the file aside; a new run starts a fresh one") from None


def newest_per_worker(store, kind: str) -> list[int]:
    """The id of the newest record of ``kind`` per writer (rank, pid and job columns): a worker's latest dump."""
    job = "job_id" if store.schema_version >= 2 else "NULL"
    sql = ("SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY rank, pid, "
           f"{job} ORDER BY time DESC, id DESC) AS n FROM records WHERE kind = ?) WHERE n = 1 ORDER BY id")
    return [row[0] for row in _rows(store, sql, [kind])]


def tails(store, ids: list[int], columns: Sequence[str], arrays: Sequence[str],
          keep: int) -> Iterator[tuple[tuple, dict[str, list[Any]]]]:
    """Per record of ``ids``, in (time, id) order: its row ``(id,) + columns`` with ``data`` written without the
    JSON arrays at ``arrays`` (paths), and those arrays' newest items (``{}`` when ``data`` is not an object).

    An array keeps its last ``keep`` items per entry of ``$.groups`` (at least ``keep``); an item that is
    not an object is left out, and an array that is not there, or not an array, reads as none. Each dump is
    parsed whole in Python (orjson: 0.36 s for a thousand 48 KB dumps, records and all, where SQLite's JSON
    functions picking the same items took 0.72 s) and cut at once, :data:`_WHOLE_AT_ONCE` dumps at a time: a
    thousand 180 KB dumps are never all in memory. A row that is not JSON comes as it is, its arrays as none.
    """
    at = 1 + list(columns).index("data")
    for row, data, found in _parsed_tails(store, ids, columns, arrays, keep):
        if data is not _NOT_JSON:  # what remains, written again (a few KB)
            row = row[:at] + (json.dumps(data, separators=(",", ":"), ensure_ascii=False),) + row[at + 1:]
        yield row, found


def _parsed_tails(store, ids: list[int], columns: Sequence[str], arrays: Sequence[str],
                  keep: int) -> Iterator[tuple[tuple, Any, dict[str, list[Any]]]]:
    """:func:`tails` with each row's data as parsed (``_NOT_JSON``: not a JSON object, the row as it is)."""
    for path in arrays:
        if not _FIELD.match(path):
            raise UsageError(f"data field {path!r} cannot be read in SQL", fix="name fields as word.word")
    selected = ["id"] + ["NULL" if store.schema_version < 2 and c == "job_id" else c for c in columns]
    at = selected.index("data")
    paths = [path.split(".") for path in arrays]
    for start in range(0, len(ids), 5000):
        chunk = ids[start:start + 5000]
        # the order from the ids alone: sorting the rows themselves (45 KB a dump) spills SQLite's sorter to disk
        order = [row[0] for row in _rows(store, f"SELECT id FROM {store.rows_table} WHERE id IN "
                                                f"({','.join('?' * len(chunk))}) ORDER BY time, id", list(chunk))]
        for first in range(0, len(order), _WHOLE_AT_ONCE):
            some = order[first:first + _WHOLE_AT_ONCE]
            rows = {row[0]: row for row in _rows(store, f"SELECT {', '.join(selected)} FROM records WHERE id IN "
                                                        f"({','.join('?' * len(some))})", list(some))}
            for full in filter(None, (rows.pop(record_id, None) for record_id in some)):  # gone meanwhile: left out
                yield _cut_arrays(full, at, arrays, paths, keep)


#: Dumps :func:`tails` reads whole at a time (64 of the largest, 180 KB each: 12 MB).
_WHOLE_AT_ONCE = 64
_NOT_JSON = object()


def _cut_arrays(row: tuple, at: int, arrays: Sequence[str], paths: list[list[str]],
                keep: int) -> tuple[tuple, Any, dict[str, list[Any]]]:
    """One row of :func:`_parsed_tails`: its data parsed, each array at ``paths`` taken out of it and cut to its
    newest objects."""
    text = row[at]
    data = loads(text, _NOT_JSON) if isinstance(text, str) else _NOT_JSON
    if not isinstance(data, dict):
        return row, _NOT_JSON, {}
    groups = data.get("groups")
    limit = keep * max(1, len(groups) if isinstance(groups, (dict, list)) else 1)
    found: dict[str, list[Any]] = {}
    for path, (*parents, last) in zip(arrays, paths):
        place: Any = data
        for name in parents:
            place = place.get(name) if isinstance(place, dict) else None
        items = place.pop(last, None) if isinstance(place, dict) else None
        found[path] = [item for item in items[-limit:] if isinstance(item, dict)] if isinstance(items, list) else []
    return row, data, found


def tail_records(store, ids: list[int], columns: Sequence[str], arrays: Sequence[str],
                 keep: int) -> Iterator[dict[str, Any]]:
    """The records of ``ids`` as dicts (:meth:`Record.to_dict`; ``columns``: the store's), each array at
    ``arrays`` (paths) cut to its newest items as :func:`tails` picks them, put back where it was; one at a time."""
    at = 1 + list(columns).index("data")
    for row, data, items in _parsed_tails(store, ids, columns, arrays, keep):
        if data is _NOT_JSON:
            record = store._record(row).to_dict()
        else:  # the parsed data itself: what remains is never written out and parsed again
            record = store._record(row[:at] + ("",) + row[at + 1:]).to_dict()
            record["data"] = data
        put_back(record["data"], items)  # a dump (not a foreign row): its entries back in
        yield record


def put_back(data: Any, items: dict[str, list[Any]]) -> None:
    """Each array ``_cut_arrays`` took out of ``data`` (by path: ``items``) back where it was, where its parent is
    an object."""
    for path, values in items.items():
        *parents, last = path.split(".")
        place = data
        for name in parents:
            place = place.get(name) if isinstance(place, dict) else None
        if isinstance(place, dict):
            place[last] = values

