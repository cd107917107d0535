"""The evidence database's layout: its columns and the migrations that build it, one version each.

Version 3 keeps each sender's identity once (``senders``: the ten columns a batch header carries) and each row
with a number for it (``entries``); ``records`` is the view of both, with every column a ``records`` table had,
in the same order, so every query reads one run's file whatever its version (an older raysleuth refuses a
newer schema and says to upgrade). Version 4 keeps a memory sample's numbers in columns of its own
(:data:`PACKED`), which ``records`` shows as the JSON they were. Writes go to ``entries``
(:meth:`~raysleuth.recorder.store.EvidenceStore.write_batch`); an ``INSERT``, ``UPDATE`` or ``DELETE`` on
``records`` works through its triggers.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from raysleuth.recorder.conditions import (  # noqa: F401  (read through this module too)
    LOG_SEVERE, SEALED, SEVERE_LEVELS, SPAN_SEALED, SPAN_UNBLOCKED,
)
from raysleuth.recorder.migrations import MIGRATIONS

#: The identity columns a batch header carries for all its rows.
IDENTITY_COLUMNS = (
    "world_size", "node_id", "node_ip", "hostname", "pid",
    "actor_id", "actor_name", "actor_class", "client_id", "job_id",
)
#: The per-row columns, in the order a client packs them.
ROW_COLUMNS = ("kind", "time", "rank", "step", "phase", "name", "level", "data", "seq")
COLUMNS = ROW_COLUMNS + IDENTITY_COLUMNS

SCHEMA_VERSION = len(MIGRATIONS)

#: Kinds whose ``data`` is stored in the value columns when it is exactly this template: these keys in this
#: order, each an int, a str or None (what ``json_object`` gives back unchanged; a float would come back with
#: 15 digits). Anything else is stored as JSON. Migration 4 spells the same template in SQL.
PACKED = {"memory": ("rss_bytes", "uss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes", "cuda_peak_bytes",
                     "source")}
VALUE_COLUMNS = ("v0", "v1", "v2", "v3", "v4", "v5")


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
ENTRY_COLUMNS = ROW_COLUMNS + ("sender", "client") + VALUE_COLUMNS
#: What :meth:`~raysleuth.recorder.store.EvidenceStore.write_batch` runs for its rows (a resent row is ignored).
INSERT_ENTRY = (f"INSERT OR IGNORE INTO entries ({', '.join(ENTRY_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(ENTRY_COLUMNS))})")


NO_VALUES = (None,) * len(VALUE_COLUMNS)
_INT64 = 2**63


def _plain(value: object) -> bool:
    return value is None or type(value) is str or (type(value) is int and -_INT64 <= value < _INT64)


def packed_values(kind: str, data: object) -> tuple | None:
    """The value columns of a row whose ``data`` is its kind's :data:`PACKED` template exactly (its ``data`` is
    then stored as ``''``); None when it is stored as JSON."""
    template = PACKED.get(kind)
    if template is None or type(data) is not dict or len(data) != len(template) or tuple(data) != template:
        return None
    values = tuple(data.values())
    return values + NO_VALUES[len(values):] if all(map(_plain, values)) else None


def dumps(value: Any) -> str:
    """A value as the store keeps it: text as it is, anything else as compact JSON (what JSON cannot say: repr)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, default=repr, separators=(",", ":"))


#: Kinds whose ``data`` stays JSON while these fields are also kept in the value columns, for readers in SQL
#: (``reading._field_sql``: no JSON to parse for them; a 1,000-rank hour holds 299,000 spans). Kept only where
#: each is an int, a str, None or a finite float (a REAL column keeps a float exactly; the JSON text is still
#: there for whoever reads the record); the last value column then holds :data:`COPY_MARK`. Rows written
#: before, by an older raysleuth or through the ``records`` view, have no mark and are read from their JSON.
COPIED = {"span": ("duration_s", "parent_id", "start", "end", "span_id")}
COPY_MARK = 1


def copied_values(kind: str, data: object) -> tuple | None:
    """The value columns of a :data:`COPIED` kind's row (its fields, then the mark); None: its JSON alone."""
    fields = COPIED.get(kind)
    if fields is None or type(data) is not dict:
        return None
    values: tuple[Any, ...] = tuple(map(data.get, fields))
    for value in values:  # _plain's test inlined, plus finite floats: 2.4 µs a span instead of 2.9 with calls
        of = type(value)
        if of is float:
            if value - value != 0:  # nan or inf: JSON that SQLite does not read
                return None
        elif of is int:
            if not -_INT64 <= value < _INT64:
                return None
        elif of is not str and value is not None:  # a bool, a dict, a list...
            return None
    return values + NO_VALUES[len(values) + 1:] + (COPY_MARK,)


def entry(row: Sequence[Any]) -> list:
    """The ``entries`` row (``ENTRY_COLUMNS``; sender and client None, for the writer to fill) of a row packed as
    ``ROW_COLUMNS``: its ``data`` in the value columns (:func:`packed_values`), or as JSON text (never ``''``),
    with some fields also in the value columns (:func:`copied_values`)."""
    kind, data = row[0], row[7]
    values = packed_values(kind, data)
    if values is not None:
        return [kind, row[1], row[2], row[3], row[4], row[5], row[6], "", row[8], None, None, *values]
    return [kind, row[1], row[2], row[3], row[4], row[5], row[6], dumps(data) or "{}", row[8], None, None,
            *(copied_values(kind, data) or NO_VALUES)]
