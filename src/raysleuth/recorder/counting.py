"""Read-only counts in SQL for readers that bound their output: how many records a selection holds, and when.

Both run on the store's indexes ((kind, time) and (kind, rank, time)) without reading a row's ``data``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raysleuth.recorder.reading import _rows, table_for, where_clause

__all__ = ["count_span", "time_range", "writers"]


def count_span(store, kind: str | Iterable[str], **filters: Any) -> tuple[int, float | None, float | None]:
    """(count, first time, last time) of the records of ``kind`` matching ``filters`` (those of ``where_clause``)."""
    if store.schema_version < 2 and filters.get("job") is not None:
        return 0, None, None
    where, args = where_clause(kind=kind, **filters)
    table = table_for(store, filters.get("job"))
    count, first, last = next(_rows(store, f"SELECT COUNT(*), MIN(time), MAX(time) FROM {table} WHERE "
                                    + " AND ".join(where), args))
    return int(count), first, last



def writers(store) -> list[tuple]:
    """(rank, node_ip, hostname, actor_class) of each writer identity in the run, each once (unordered).

    One scan with SQLite's ``DISTINCT`` (a small lookup tree), not a sort of every row as ``GROUP BY`` with
    aggregates needs: a third of the time of that ``GROUP BY`` on a million rows.
    """
    return list(_rows(store, "SELECT DISTINCT rank, node_ip, hostname, actor_class FROM records", []))


def time_range(store, kinds: Iterable[str]) -> tuple[float | None, float | None]:
    """(first, last) time of the records of ``kinds``: two index look-ups a kind."""
    first = last = None
    for kind in kinds:
        low, high = next(_rows(store, f"SELECT MIN(time), MAX(time) FROM {store.rows_table} WHERE kind = ?", [kind]))
        if low is not None:
            first = low if first is None else min(first, low)
            last = high if last is None else max(last, high)
    return first, last
