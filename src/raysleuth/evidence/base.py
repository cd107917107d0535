"""The typed door to a record's ``data``: :class:`Part`, :class:`Evidence`, :class:`Row` and :func:`read`.

A kind is a frozen dataclass whose fields are the ``data`` fields its writer
stores. :meth:`Evidence.from_record` builds it once from a stored record:
each field is taken when it has the field's type and falls back to its
default when it is missing or mistyped (a row another writer left must not
break a reader), nested parts are built the same way, the record's columns
go to :attr:`Evidence.row`, and the data as stored stays in
:attr:`Evidence.raw`. A kind whose shape changed has a :attr:`VERSION`;
:meth:`Evidence.version_of` tells a stored row's version from its shape
(rows never carried one) and :meth:`Evidence.upgrade` turns an old shape
into the current one, so records written by older versions still read.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar, TypeVar

__all__ = ["Evidence", "Part", "Row", "read"]

_MISSING = object()
P = TypeVar("P", bound="Part")
E = TypeVar("E", bound="Evidence")


def _checker(hint: Any):
    """A function (value -> the value when it fits ``hint``, else ``_MISSING``) for a field's type hint."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        checks = [_checker(arg) for arg in typing.get_args(hint) if arg is not type(None)]
        nullable = type(None) in typing.get_args(hint)

        def union(value: Any) -> Any:
            if value is None:
                return None if nullable else _MISSING
            for check in checks:
                fitted = check(value)
                if fitted is not _MISSING:
                    return fitted
            return _MISSING
        return union
    if hint is Any:
        return lambda value: value
    if origin is tuple:  # tuple[X, ...]: a stored list of X, items that do not fit left out
        item = _checker(typing.get_args(hint)[0])

        def items(value: Any) -> Any:
            if not isinstance(value, list | tuple):
                return _MISSING
            return tuple(fitted for fitted in map(item, value) if fitted is not _MISSING)
        return items
    if isinstance(hint, type) and issubclass(hint, Part):
        return lambda value: hint.from_data(value) if isinstance(value, dict) else _MISSING
    kind = origin or hint
    if kind is float:
        return lambda value: float(value) if type(value) in (int, float) else _MISSING
    if kind is int:
        return lambda value: value if type(value) is int else _MISSING
    return lambda value: value if isinstance(value, kind) else _MISSING


def _data(value: Any) -> Any:
    if isinstance(value, Part):
        return value.to_data()
    if isinstance(value, tuple):
        return [_data(item) for item in value]
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Part:
    """A nested object of a kind's data (a frame, a mismatch): built from a stored dict, never failing."""

    _fields: ClassVar[tuple[tuple[str, Any, Any], ...]]

    @classmethod
    def _schema(cls) -> tuple[tuple[str, Any, Any], ...]:
        if "_fields" not in cls.__dict__:
            hints = typing.get_type_hints(cls)
            cls._fields = tuple((field.name, _checker(hints[field.name]), field)
                                for field in dataclasses.fields(cls) if field.init and field.name not in ("row", "raw"))
        return cls._fields

    @classmethod
    def _fitted(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The fields of ``data`` that fit this class's types (the others are left to their defaults)."""
        values = {}
        for name, check, _ in cls._schema():
            value = data.get(name, _MISSING)
            if value is not _MISSING:
                value = check(value)
            if value is not _MISSING:
                values[name] = value
        return values

    @classmethod
    def from_data(cls: type[P], data: dict[str, Any]) -> P:
        """The part from a stored dict: fields of the wrong type or missing get their defaults."""
        return cls(**cls._fitted(data))

    def to_data(self) -> dict[str, Any]:
        """The JSON-ready dict a writer stores (parts as dicts, tuples as lists)."""
        return {name: _data(getattr(self, name)) for name, _, _ in self._schema()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """A record's columns (who wrote it, when, and where in the job), as stored beside its data."""

    id: int | None = None
    time: float = 0.0
    rank: int | None = None
    step: int | None = None
    phase: str | None = None
    name: str | None = None
    level: str | None = None
    world_size: int | None = None
    node_id: str | None = None
    node_ip: str | None = None
    hostname: str | None = None
    pid: int | None = None
    actor_id: str | None = None
    actor_name: str | None = None
    actor_class: str | None = None
    job_id: str | None = None
    seq: int | None = None
    client_id: str | None = None

    @classmethod
    def of(cls, record: Any) -> Row:
        """The columns of a :class:`raysleuth.recorder.store.Record` (or anything with those attributes)."""
        row = object.__new__(cls)  # built once per stored row: its fields set at once, past the frozen __init__
        source = getattr(record, "__dict__", None)
        if source is None or not all(name in source for name in _ROW_COLUMNS[:-2]):
            source = {name: getattr(record, name, None) for name in _ROW_COLUMNS}
        row.__dict__.update({name: source.get(name) for name in _ROW_COLUMNS})
        row.__dict__["time"] = row.__dict__["time"] or 0.0
        return row


_ROW_COLUMNS = tuple(field.name for field in dataclasses.fields(Row))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Evidence(Part):
    """One stored record of a kind: its data fields, its :attr:`row` (columns) and the :attr:`raw` data."""

    KIND: ClassVar[str] = ""
    """The ``kind`` column."""
    NAME: ClassVar[str | None] = None
    """For the kinds that share a ``kind`` column (events): the ``name`` column this one has."""
    VERSION: ClassVar[int] = 1
    """The current shape; an older stored shape is read through :meth:`upgrade`."""
    WRITTEN_BY: ClassVar[str] = ""
    """Who writes it (the table of kinds in CONTRIBUTING.md is generated from these)."""
    NAMED: ClassVar[str] = ""
    """What its ``name`` column holds."""
    NOTE: ClassVar[str] = ""
    """Anything else the table says about the kind's data."""

    row: Row = dataclasses.field(default_factory=Row, compare=False)
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def version_of(cls, data: dict[str, Any]) -> int:
        """The shape ``data`` was written in (told from the fields it has: rows carry no version)."""
        return cls.VERSION

    @classmethod
    def upgrade(cls, data: dict[str, Any], version: int) -> dict[str, Any]:
        """``data`` written in shape ``version``, in the current shape."""
        return data

    @classmethod
    def from_record(cls: type[E], record: Any) -> E:
        """The kind from one stored record (data that is not an object reads as empty)."""
        stored = record.data if isinstance(getattr(record, "data", None), dict) else {}
        data = cls.upgrade(stored, cls.version_of(stored))
        return cls(**cls._fitted(data), row=Row.of(record), raw=stored)

    @classmethod
    def from_record_dict(cls: type[E], record: dict[str, Any]) -> E:
        """The kind from a stored record as a dict (``Record.to_dict()``, :meth:`to_record_dict`)."""
        return cls.from_record(_Stored(record))

    def to_record_dict(self) -> dict[str, Any]:
        """The stored record as JSON (``Record.to_dict()``'s keys and order: columns, ``data`` as stored)."""
        row = self.row
        return {"id": row.id, "kind": self.KIND, "time": row.time, "rank": row.rank, "step": row.step,
                "phase": row.phase, "name": row.name, "level": row.level, "data": self.raw, "seq": row.seq,
                "world_size": row.world_size, "node_id": row.node_id, "node_ip": row.node_ip,
                "hostname": row.hostname, "pid": row.pid, "actor_id": row.actor_id, "actor_name": row.actor_name,
                "actor_class": row.actor_class, "client_id": row.client_id, "job_id": row.job_id}


class _Stored:
    """A record given as a dict, read through attributes (what :meth:`Evidence.from_record` reads)."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.__dict__.update(record)


def read(store: Any, kind: type[E] | tuple[type[E], ...], *, limit: int | None = None, newest_first: bool = False,
         **filters: Any) -> list[E]:
    """The records of ``kind`` (one :class:`Evidence` class, or several read in one pass) in ``store``.

    ``filters`` are :meth:`raysleuth.recorder.store.EvidenceStore.query`'s (``rank``, ``job``, ``since``,
    ``after_id``, ``step_min``, ``levels``, ``ids``...); an event kind's :attr:`Evidence.NAME` is its
    ``name`` filter. This is the one reader of ``record.data`` outside the recorder.
    """
    kinds = kind if isinstance(kind, tuple) else (kind,)
    by_key = {(k.KIND, k.NAME): k for k in kinds}
    names = {k.NAME for k in kinds}
    if len(names) == 1 and None not in names:
        filters.setdefault("name", next(iter(names)))
    records = store.query(sorted({k.KIND for k in kinds}), limit=limit, newest_first=newest_first, **filters)
    out = []
    for record in records:
        found = by_key.get((record.kind, record.name)) or by_key.get((record.kind, None))
        if found is not None:
            out.append(found.from_record(record))
    return out
