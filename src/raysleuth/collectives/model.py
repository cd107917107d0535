"""Collective positions as plain data: entries per rank and process group, findings, verdicts.

Reads ``collectives`` records (store rows as dicts) into :class:`RankPositions`;
:mod:`raysleuth.collectives.matcher` aligns them. Pure: no Ray, no torch.

Input: ``collectives`` records (the store's rows as dicts, each with the
worker's ``data`` from :func:`raysleuth.collectives.record.snapshot`). How
ranks are aligned and who is named is stated in :mod:`.matcher`.

A busy, healthy job (ranks dumped at slightly different moments, nothing
waiting long) gives no culprit.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Literal

from raysleuth import evidence
from raysleuth.evidence.entries import (  # noqa: F401 (the collectives feature's names for them)
    ENTRIES_PER_GROUP,
    Entry,
    EntryState,
    _call_at,
    entries_from_dump,
)
from raysleuth.options import format_ranks

RULE = "collective positions"
WINDOW_ENTRIES = 256
"""Entries per group of a dump asked for a time window (``raysleuth stragglers``: its ``--window`` of calls; the
request's ``limit``), at most :data:`MAX_ENTRIES` (the wrapper's ring holds 512 calls, the Flight Recorder 2,000)."""
MAX_ENTRIES = 2000


def entries_asked(request: Any) -> int:
    """Entries per group a dump request asks for (its ``limit``, 1 to :data:`MAX_ENTRIES`), else
    :data:`ENTRIES_PER_GROUP`."""
    wanted = request.get("limit") if isinstance(request, dict) else None
    return min(wanted, MAX_ENTRIES) if type(wanted) is int and wanted > 0 else ENTRIES_PER_GROUP


FindingKind = Literal["skipped", "op", "shape", "dtype", "mismatch", "dead", "stuck", "behind", "ahead"]
"""How a rank broke its group's sequence (``raysleuth collectives --json``: ``culprits[].kind``)."""


@dataclasses.dataclass
class RankPositions:
    """One rank's collectives per process group, merged from its dumps."""

    rank: int
    pid: int | None = None
    node_ip: str | None = None
    alive: bool | None = None
    dumped_at: float = 0.0
    groups: dict[str, dict[int, Entry]] = dataclasses.field(default_factory=dict)
    group_info: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def last(self, group: str) -> Entry | None:
        entries = self.groups.get(group) or {}
        return entries[max(entries)] if entries else None


@dataclasses.dataclass
class Finding:
    """A rank that broke the sequence of one process group, and why."""

    rank: int
    kind: FindingKind
    group: str
    seq: int | None
    reason: str
    file: str | None = None
    line: int | None = None
    step: int | None = None
    pid: int | None = None
    node_ip: str | None = None
    rule: str = RULE

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class GroupAlignment:
    """One process group: its ranks, the last collectives aligned by sequence number, its findings."""

    name: str
    desc: str
    ranks: list[int]
    rows: list[dict[str, Any]]
    findings: list[Finding]
    last: dict[int, int]
    """rank -> newest sequence number it entered (0: none)."""

    @property
    def label(self) -> str:
        return self.desc if self.desc and self.desc not in ("undefined", "") else f"group {self.name}"

    def columns(self, alone: int = 8) -> list[list[int]]:
        """The ranks as a table's columns: each its own up to ``alone`` ranks; past that, the ranks whose every
        row reads alike (call, where, state) share one, the most ranks first (a thousand ranks, a few columns)."""
        if len(self.ranks) <= alone:
            return [[rank] for rank in self.ranks]
        alike: dict[tuple, list[int]] = {}
        for rank in self.ranks:
            alike.setdefault(tuple(_cell_key(row, rank) for row in self.rows), []).append(rank)
        return sorted(alike.values(), key=lambda ranks: (-len(ranks), ranks[0]))

    def headed_columns(self, alone: int = 8) -> list[tuple[str, int]]:
        """:meth:`columns` as (header, the rank whose cells it shows): ``rank 7``, ``999 ranks 0-6,8-999``."""
        return [(f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks {format_ranks(ranks)}", ranks[0])
                for ranks in self.columns(alone)]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["label"] = self.label
        return data


def _cell_key(row: dict[str, Any], rank: int) -> tuple | None:
    """What a rank's cell of a row shows (None: no entry at that sequence number)."""
    cell = row["ranks"].get(rank) if isinstance(row["ranks"], dict) else None
    return None if cell is None else (cell["call"], cell.get("where") or "", cell["state"])


@dataclasses.dataclass
class CollectiveVerdict:
    """Every process group aligned; culprits first."""

    groups: list[GroupAlignment]
    culprits: list[Finding]
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return {"groups": [g.to_dict() for g in self.groups], "culprits": [c.to_dict() for c in self.culprits],
                "summary": self.summary}


# ---------------------------------------------------------------- reading


def _dumped_at(dump: evidence.Collectives) -> float:
    return dump.time or dump.row.time or 0.0


def latest_job(records: Iterable[dict[str, Any]]) -> str | None:
    """The job of the newest record (a run may hold several jobs' collectives)."""
    return newest_job(map(evidence.Collectives.from_record_dict, records))


def newest_job(dumps: Iterable[evidence.Collectives]) -> str | None:
    """:func:`latest_job` of dumps already read (a dump's fields are checked once, not once per question)."""
    newest = max(dumps, key=_dumped_at, default=None)
    return newest.job_id if newest else None


def positions_from_records(records: Iterable[dict[str, Any]], *, alive: set | None = None,
                           job: str | None = None) -> list[RankPositions]:
    """Merge each rank's dumps (newest wins per entry), for one job (default: the newest record's).

    ``alive``: the (node_ip, pid) pairs still running (None: unknown).
    """
    return positions_from_dumps(list(map(evidence.Collectives.from_record_dict, records)), alive=alive, job=job)


def positions_from_dumps(dumps: list[evidence.Collectives], *, alive: set | None = None, job: str | None = None,
                         taken: dict[int, dict[str, dict[int, Entry]]] | None = None) -> list[RankPositions]:
    """:func:`positions_from_records` of dumps already read (``taken``: entries already taken from some of them,
    by ``id`` of the dump, whose arrays were then dropped)."""
    job = job if job is not None else newest_job(dumps)
    ranks: dict[int, RankPositions] = {}
    for dump in sorted(dumps, key=_dumped_at):
        data = dump.raw
        if job is not None and dump.job_id not in (None, job):
            continue
        rank = dump.rank if "rank" in data else dump.row.rank
        if rank is None:
            continue
        pid, node_ip = dump.pid or dump.row.pid, dump.row.node_ip
        known = ranks.get(rank)
        if known is None or (pid is not None and known.pid is not None and pid != known.pid):
            known = ranks[rank] = RankPositions(rank=rank, pid=pid, node_ip=node_ip)  # a new process took the rank
        known.dumped_at = max(known.dumped_at, _dumped_at(dump))
        found = taken.get(id(dump)) if taken else None
        for group, entries in (found if found is not None else entries_from_dump(data)).items():
            known.groups.setdefault(group, {}).update(entries)
        for group, info in dump.groups.items():
            known.group_info[str(group)] = info
    if alive is not None:
        for item in ranks.values():
            item.alive = (item.node_ip, item.pid) in alive or (None, item.pid) in alive
    return [ranks[r] for r in sorted(ranks)]


