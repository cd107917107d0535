"""Read-only counts in SQL for readers that bound their output: how many records a selection holds, and when.

Both run on the store's indexes ((kind, time) and (kind, rank, time)) without reading a row's ``data``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raysleuth.recorder.reading import _rows, table_for, where_clause

__all__ = ["count_span", "ranks", "time_range", "writers"]


def count_span(store, kind: str | Iterable[str], **filters: Any) -> tuple[int, float | None, float | None]:
    """(count, first time, last time) of the records of ``kind`` matching ``filters`` (those of ``where_clause``)."""
    if store.schema_version < 2 and filters.get("job") is not None:
        return 0, None, None
    where, args = where_clause(kind=kind, **filters)
    table = table_for(store, filters.get("job"))
    count, first, last = next(_rows(store, f"SELECT COUNT(*), MIN(time), MAX(time) FROM {table} WHERE "
                                    + " AND ".join(where), args))
    return int(count), first, last



#: Every rank of every kind, a seek of the (kind, rank, time) index each, from each kind's least (schema 9's counts).
_RANK_WALK = ("WITH RECURSIVE walk(kind, rank) AS (SELECT kind, (SELECT min(rank) FROM entries WHERE kind = k.kind) "
              "FROM kind_counts k WHERE n > 0 UNION ALL SELECT kind, (SELECT min(rank) FROM entries WHERE "
              "kind = walk.kind AND rank > walk.rank) FROM walk WHERE rank IS NOT NULL) "
              "SELECT DISTINCT rank FROM walk WHERE rank IS NOT NULL ORDER BY rank")


def ranks(store) -> list:
    """Every rank a record carries, sorted (:meth:`EvidenceStore.ranks`), by walking the (kind, rank, time) index:
    a seek per kind and rank, where SQLite's DISTINCT walks every row (a full-mode 1,000-rank hour: 1.3 s). Files
    before schema 9 (no counts of their kinds): SQLite's DISTINCT."""
    if store.schema_version < 9:
        sql = f"SELECT DISTINCT rank FROM {store.rows_table} WHERE rank IS NOT NULL ORDER BY rank"
        return [row[0] for row in _rows(store, sql, [])]
    return [row[0] for row in _rows(store, _RANK_WALK, [])]


def writers(store, kinds: Iterable[str] | None = None) -> list[tuple]:
    """(rank, node_ip, hostname, actor_class) of the run's writers, each rank and each sender identity at least once
    (unordered; a rank comes with no identity, an identity with no rank: readers take them as separate sets).

    From schema 3 on, the ranks are found through the (kind, rank, time) index one rank at a time (a seek each;
    ``kinds``: the kinds to look in, default every kind the run holds) and the identities in the ``senders``
    table, where every row's sender is written: 1,000 ranks in milliseconds, where a scan of every row took
    0.21 s for a 1,000-rank hour. Before, one scan of every row with SQLite's ``DISTINCT``.
    """
    if store.rows_table != "entries":
        return list(_rows(store, "SELECT DISTINCT rank, node_ip, hostname, actor_class FROM records", []))
    ranks: set = set()
    for kind in store.kinds() if kinds is None else kinds:  # each next rank: the smallest above the last, a seek
        ranks.update(row[0] for row in _rows(store, (
            "WITH RECURSIVE seen(rank) AS (SELECT MIN(rank) FROM entries WHERE kind = ?1 UNION ALL "
            "SELECT (SELECT MIN(rank) FROM entries WHERE kind = ?1 AND rank > seen.rank) FROM seen "
            "WHERE seen.rank IS NOT NULL) SELECT rank FROM seen WHERE rank IS NOT NULL"), [kind]))
    found = [(rank, None, None, None) for rank in ranks]
    found += _rows(store, "SELECT DISTINCT NULL, node_ip, hostname, actor_class FROM senders", [])
    return found


def time_range(store, kinds: Iterable[str]) -> tuple[float | None, float | None]:
    """(first, last) time of the records of ``kinds``: two index look-ups a kind (each its own sub-select: SQLite
    answers one ``MIN`` or ``MAX`` from the index alone, but both in one select by scanning the kind's rows)."""
    first = last = None
    table = store.rows_table
    for kind in kinds:
        low, high = next(_rows(store, f"SELECT (SELECT MIN(time) FROM {table} WHERE kind = ?), "
                                      f"(SELECT MAX(time) FROM {table} WHERE kind = ?)", [kind, kind]))
        if low is not None:
            first = low if first is None else min(first, low)
            last = high if last is None else max(last, high)
    return first, last
