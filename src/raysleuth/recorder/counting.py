"""Read-only counts in SQL for readers that bound their output: how many records a selection holds, and when.

Both run on the store's indexes ((kind, time) and (kind, rank, time)) without reading a row's ``data``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raysleuth.recorder.reading import _rows, where_clause

__all__ = ["count_span"]


def count_span(store, kind: str | Iterable[str], **filters: Any) -> tuple[int, float | None, float | None]:
    """(count, first time, last time) of the records of ``kind`` matching ``filters`` (those of ``where_clause``)."""
    if store.schema_version < 2 and filters.get("job") is not None:
        return 0, None, None
    where, args = where_clause(kind=kind, **filters)
    count, first, last = next(_rows(store, "SELECT COUNT(*), MIN(time), MAX(time) FROM records WHERE "
                                    + " AND ".join(where), args))
    return int(count), first, last

