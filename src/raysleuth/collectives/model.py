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

import bisect
import dataclasses
import os
from collections import defaultdict
from typing import Any, Iterable, Literal

from raysleuth import evidence

RULE = "collective positions"
ENTRIES_PER_GROUP = 64
"""Entries per process group a worker's dump holds and a reader reads, the newest (the matcher shows 8; its
pattern check needs 48). Older ones are never read: the newest already show where the ranks part. A dump held
256 before: a 1,000-rank run's two dumps a worker took 184 MB, 29 % of its store, three quarters never read."""
WINDOW_ENTRIES = 256
"""Entries per group of a dump asked for a time window (``raysleuth stragglers``: its ``--window`` of calls; the
request's ``limit``), at most :data:`MAX_ENTRIES` (the wrapper's ring holds 512 calls, the Flight Recorder 2,000)."""
MAX_ENTRIES = 2000


def entries_asked(request: Any) -> int:
    """Entries per group a dump request asks for (its ``limit``, 1 to :data:`MAX_ENTRIES`), else
    :data:`ENTRIES_PER_GROUP`."""
    wanted = request.get("limit") if isinstance(request, dict) else None
    return min(wanted, MAX_ENTRIES) if type(wanted) is int and wanted > 0 else ENTRIES_PER_GROUP


_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
           "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
           "ComplexFloat": "complex64", "ComplexDouble": "complex128"}
# Ops whose inputs must agree across ranks (others, e.g. all_to_all_single with splits, may differ).
_SAME_INPUTS = {"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "_allgather_base",
                "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "barrier", "allreduce"}


EntryState = Literal["completed", "pending", "error"]
"""Where one collective of one rank stands (a ``calls``/``entries`` state read from a dump)."""
FindingKind = Literal["skipped", "op", "shape", "dtype", "mismatch", "dead", "stuck", "behind", "ahead"]
"""How a rank broke its group's sequence (``raysleuth collectives --json``: ``culprits[].kind``)."""


@dataclasses.dataclass
class Entry:
    """One collective of one rank, as aligned."""

    seq: int
    op: str
    inputs: list = dataclasses.field(default_factory=list)
    """[[shape, dtype], ...]"""
    state: EntryState = "completed"
    created: float | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    step: int | None = None
    call: int | None = None
    """How many times this rank had issued a collective from this file:line (1 = first)."""

    def signature(self) -> tuple:
        if self.op in _SAME_INPUTS:
            return (self.op, tuple((tuple(shape), dtype) for shape, dtype in self.inputs))
        return (self.op,)

    def describe(self) -> str:
        """``all_reduce(float32[64,64])``"""
        args = ", ".join(f"{dtype}[{','.join(map(str, shape))}]" for shape, dtype in self.inputs[:3])
        return f"{self.op}({args}{', ...' if len(self.inputs) > 3 else ''})"

    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}" if self.file else ""

    def when(self) -> str:
        """``at step 4`` or ``(call 5 at train.py:61)``"""
        if self.step is not None:
            return f"at step {self.step}"
        return f"(call {self.call} at {self.where()})" if self.call and self.file else ""


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

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["label"] = self.label
        return data


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


def entries_from_dump(data: dict[str, Any]) -> dict[str, dict[int, Entry]]:
    """One dump's entries per process group (Flight Recorder where present, joined with the wrapper's frames)."""
    calls = [c for c in data.get("calls") or [] if isinstance(c, dict)]
    fr = (data.get("flight_recorder") or {}).get("entries") or []
    groups: dict[str, dict[int, Entry]] = defaultdict(dict)
    if fr:
        status = (data.get("flight_recorder") or {}).get("pg_status") or {}
        by_group: dict[str, list[dict]] = defaultdict(list)
        for call in calls:
            by_group[str(call.get("pg"))].append(call)
        sorted_calls = {group: _Calls(listed) for group, listed in by_group.items()}
        done_in: dict[str, int] = {}
        for raw in fr:
            get = raw.get
            if get("is_p2p") or not get("collective_seq_id"):
                continue
            group = str((get("process_group") or ["?"])[0])
            seq = int(raw["collective_seq_id"])
            created = get("time_created_ns")
            group_calls = sorted_calls.get(group)
            joined = group_calls.at(int(created) if isinstance(created, (int, float)) else None) \
                if group_calls is not None else None
            done = done_in.get(group)
            if done is None:
                done = done_in[group] = _int((status.get(group) or {}).get("last_completed_collective"), -1)
            profiled = get("profiling_name")
            label = str(profiled) if profiled else None
            blocking = label is not None and label.startswith("gloo:")
            state = "completed" if seq <= done or (blocking and _returned_around(joined, created)) else "pending"
            if joined is not None and joined.get("state") == "error":
                state = "error"
            inputs = [[list(shape), _dtype(dtype)] for shape, dtype in zip(get("input_sizes") or [],
                                                                           get("input_dtypes") or [])]
            groups[group][seq] = _entry(seq, label.split(":")[-1] if label is not None else "?", inputs, state,
                                        (created or 0) / 1e9 or None, joined)
        return dict(groups)
    for call in calls:
        state = {"started": "pending", "error": "error"}.get(str(call.get("state")), "completed")
        groups[str(call.get("pg"))][int(call["seq"])] = _entry(int(call["seq"]), str(call.get("op")),
                                                                list(call.get("input") or []), state,
                                                                (call.get("start_ns") or 0) / 1e9 or None, call)
    return dict(groups)


def _dtype(name: Any) -> str:
    """torch's dtype name in a Flight Recorder entry (``Float``) as the wrapper writes it (``float32``)."""
    known = _DTYPES.get(name)
    return known if known is not None else str(name).lower()


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class _Calls:
    """One group's wrapper calls sorted by start, to find the call of each Flight Recorder entry by bisection."""

    __slots__ = ("calls", "starts")

    def __init__(self, calls: list[dict]) -> None:
        starts = [_start(call) for call in calls]
        order = sorted(range(len(calls)), key=starts.__getitem__)  # stable: equal starts in list order
        self.calls = [(calls[k], k) for k in order]
        self.starts = [starts[k] for k in order]

    def at(self, created_ns: int | None) -> dict | None:
        """The wrapper call during which torch created this entry (the last one started before it).

        As a scan of every call would answer: the latest start at or before the entry (the first listed
        among equal starts) when the entry falls within it, else the call starting nearest to it (2 ms).
        """
        if not created_ns:
            return None
        slack = 2_000_000
        right = bisect.bisect_right(self.starts, created_ns)
        if right:
            first = bisect.bisect_left(self.starts, self.starts[right - 1])
            call = self.calls[first][0]  # equal starts sort by list order: the first listed, as max() keeps
            end = call.get("end_ns")
            if end is None or created_ns <= end + slack:
                return call
        low = bisect.bisect_left(self.starts, created_ns - slack)
        high = bisect.bisect_right(self.starts, created_ns + slack)
        if low >= high:
            return None
        return min(self.calls[low:high], key=lambda item: (abs(_start(item[0]) - created_ns), item[1]))[0]


def _start(call: dict) -> int:
    start = call.get("start_ns") or 0
    return int(start) if isinstance(start, (int, float)) else 0


def _call_at(calls: list[dict], created_ns: int | None) -> dict | None:
    """The wrapper call during which torch created this Flight Recorder entry (see :meth:`_Calls.at`)."""
    return _Calls(calls).at(created_ns)


def _returned_around(call: dict | None, created_ns: int | None) -> bool:
    """Whether torch created this entry inside a blocking wrapper call that has returned: then it completed.

    The Flight Recorder marks a gloo collective completed from gloo's own
    thread, a moment after the call returned (measured: one call in seven
    still reads pending right after it returns, longer under load), so a rank
    blocked just after a collective would read as still inside it. Only for
    gloo: an NCCL call returns once the work is queued on the GPU stream, and
    its entry is completed only when the Flight Recorder says so.
    """
    if not call or not created_ns or call.get("state") != "completed":
        return False
    start, end = call.get("start_ns"), call.get("end_ns")
    return start is not None and end is not None and start <= created_ns <= end


def _entry(seq, op, inputs, state, created, call) -> Entry:
    call = call or {}
    return Entry(seq=seq, op=op, inputs=inputs, state=state, created=created, file=call.get("file"),
                 line=call.get("line"), function=call.get("function"), step=call.get("step"), call=call.get("call"))


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


