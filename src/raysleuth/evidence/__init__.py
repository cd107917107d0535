"""raysleuth's own evidence, typed: one frozen dataclass per record kind, and :func:`read`, the one reader.

Every feature writes records through :func:`raysleuth.recorder.record` and
every reader gets them back through ``evidence.read(store, Kind, **filters)``:
a list of ``Kind`` objects, each built once from its row (see
:mod:`raysleuth.evidence.base`). The table of kinds in CONTRIBUTING.md is
:func:`kinds_table`'s output (``tests/test_evidence.py`` keeps it current).
"""

from __future__ import annotations

import dataclasses
import typing

from raysleuth.evidence.activity import Event, Heartbeat, Log, Memory, MemoryCapsule, Span
from raysleuth.evidence.base import Evidence, Part, Row, read
from raysleuth.evidence.calls import Coroutines, DebugSessionRecord, LogprobGap, PoolCall, VerlCall, WeightSync
from raysleuth.evidence.events import CapsulesSkipped, Finished, Instrumented, RankKnown, SpoolDropped, Stall
from raysleuth.evidence.failures import (ChainLink, Consistency, ConsistencyMismatch, Crash, CrashFrame, Death,
                                         DeathFrame, Explanation)
from raysleuth.evidence.reports import (Collectives, Culprit, DoctorCheck, DoctorRun, NamedStraggler, SlowPhasePart,
                                        StackFrame, StackGroup, StackRun, StackVerdict, StragglerRun, TaskItem, TasksRun,
                                        WaitSite)

__all__ = ["KINDS", "CapsulesSkipped", "ChainLink", "Collectives", "Consistency", "ConsistencyMismatch", "Coroutines",
           "Crash", "CrashFrame", "Culprit", "Death", "DeathFrame", "DebugSessionRecord", "DoctorCheck", "DoctorRun", "Event",
           "Evidence", "Explanation", "Finished", "Heartbeat", "Instrumented", "Log", "LogprobGap", "Memory",
           "MemoryCapsule", "NamedStraggler", "Part", "PoolCall", "RankKnown", "Row", "Span", "SlowPhasePart", "SpoolDropped", "StackFrame", "StackGroup", "StackRun",
           "StackVerdict", "Stall", "StragglerRun", "TaskItem", "TasksRun", "VerlCall", "WaitSite", "WeightSync", "kinds_table",
           "read"]

#: Every kind, in the order of the table.
KINDS: tuple[type[Evidence], ...] = (
    DebugSessionRecord, DoctorRun, Consistency, Span, Event, Heartbeat, StackRun, Coroutines, Collectives,
    StragglerRun, Stall, Finished, Crash, CapsulesSkipped, SpoolDropped, Log, Memory, MemoryCapsule, PoolCall,
    VerlCall, Instrumented, Death, RankKnown, WeightSync, LogprobGap, TasksRun,
)


def _fields(cls: type[Part]) -> str:
    """A kind's data fields, nested parts' fields in brackets."""
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        if not field.init or field.name in ("row", "raw"):
            continue
        hint = hints[field.name]
        inner = typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else hint
        if isinstance(inner, type) and issubclass(inner, Part) and not issubclass(inner, Evidence):
            out.append(f"`{field.name}` [{_fields(inner)}]")
        else:
            out.append(f"`{field.name}`")
    return ", ".join(out)


def kinds_table() -> str:
    """The Markdown table of every kind (CONTRIBUTING.md holds this text)."""
    lines = ["| kind | class | written by | name | data fields | version |", "|---|---|---|---|---|---|"]
    for kind in KINDS:
        label = f"`{kind.KIND}`" + (f" (name `{kind.NAME}`)" if kind.NAME else "")
        fields = _fields(kind) or "the keyword arguments given"
        if kind.NOTE:
            fields += f"; {kind.NOTE}"
        lines.append(f"| {label} | `{kind.__name__}` | {kind.WRITTEN_BY} | {kind.NAMED} | {fields} | {kind.VERSION} |")
    return "\n".join(lines) + "\n"
