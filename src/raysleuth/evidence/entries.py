"""How a collectives dump's arrays read as entries: one :class:`Entry` per collective of one rank and group.

A ``collectives`` record (:class:`~raysleuth.evidence.Collectives`) holds a worker's newest wrapper calls and,
where torch's Flight Recorder is on, its entries; :func:`entries_from_dump` joins them into entries per process
group. Pure, no Ray, no torch. Here, beside the record's kind, so that the store's writer can take each dump's
entries out once at ingest (``recorder.compact``) as well as the collectives feature read them
(``raysleuth.collectives.model`` names them for the feature).
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from collections import defaultdict
from typing import Any, Literal

__all__ = ["ENTRIES_PER_GROUP", "Entry", "EntryState", "entries_from_dump"]

ENTRIES_PER_GROUP = 64
"""Entries per process group a worker's dump holds and a reader reads, the newest (the matcher shows 8; its
pattern check needs 48). Older ones are never read: the newest already show where the ranks part. A dump held
256 before: a 1,000-rank run's two dumps a worker took 184 MB, 29 % of its store, three quarters never read."""

_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
           "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
           "ComplexFloat": "complex64", "ComplexDouble": "complex128"}
# Ops whose inputs must agree across ranks (others, e.g. all_to_all_single with splits, may differ).
_SAME_INPUTS = {"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "_allgather_base",
                "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "barrier", "allreduce"}


EntryState = Literal["completed", "pending", "error"]
"""Where one collective of one rank stands (a ``calls``/``entries`` state read from a dump)."""


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


#: What reading an entry raises where a dump holds something no worker writes (a NaN time, a seq that is not a
#: number, an entry that is not an object): that entry is left out, the rest of the dump read.
_MALFORMED = (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError)


def entries_from_dump(data: dict[str, Any]) -> dict[str, dict[int, Entry]]:
    """One dump's entries per process group (Flight Recorder where present, joined with the wrapper's frames).

    An entry that is not what a worker writes is left out; the dump's other entries are read."""
    listed = data.get("calls")
    calls = [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []
    recorder = data.get("flight_recorder")
    recorder = recorder if isinstance(recorder, dict) else {}
    fr = recorder.get("entries") or []
    groups: dict[str, dict[int, Entry]] = defaultdict(dict)
    if fr and isinstance(fr, list):
        status = recorder.get("pg_status")
        status = status if isinstance(status, dict) else {}
        by_group: dict[str, list[dict]] = defaultdict(list)
        for call in calls:
            by_group[str(call.get("pg"))].append(call)
        sorted_calls = {group: _Calls(listed) for group, listed in by_group.items()}
        done_in: dict[str, int] = {}
        for raw in fr:
            try:
                _recorded(raw, groups, sorted_calls, status, done_in)
            except _MALFORMED:
                continue
        return dict(groups)
    for call in calls:
        try:
            seq = int(call["seq"])
            state = {"started": "pending", "error": "error"}.get(str(call.get("state")), "completed")
            groups[str(call.get("pg"))][seq] = _entry(seq, str(call.get("op")), list(call.get("input") or []),
                                                      state, (call.get("start_ns") or 0) / 1e9 or None, call)
        except _MALFORMED:
            continue
    return dict(groups)


def _recorded(raw: dict, groups: dict[str, dict[int, Entry]], sorted_calls: dict[str, _Calls],
              status: dict[str, Any], done_in: dict[str, int]) -> None:
    """One Flight Recorder entry of :func:`entries_from_dump` into ``groups``, joined with its wrapper call."""
    get = raw.get
    if get("is_p2p") or not get("collective_seq_id"):
        return
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
    return int(start) if isinstance(start, (int, float)) and start - start == 0 else 0  # NaN, inf: none


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
