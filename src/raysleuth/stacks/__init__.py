"""Hang forensics: cluster-wide Python stacks, grouped, labelled and judged.

``dump_stacks()`` reads every Ray worker and driver on every node with
py-spy (through the node agents, in parallel), labels each process (node,
pid, role, actor, rank, running task), groups identical stacks and names
the culprits: peers away from where their blocked majority waits, and the
ends of the driver's wait-for chains.

- :mod:`raysleuth.stacks.model` — the result dataclasses.
- :mod:`raysleuth.stacks.analysis` — pure logic (parse, key threads, group).
- :mod:`raysleuth.stacks.verdict` — pure logic: the rules, hung or busy.
- :mod:`raysleuth.stacks.capture` — the cluster I/O.
"""

from __future__ import annotations

from raysleuth.recorder import record
from raysleuth.stacks.analysis import group_processes, headline, parse_py_spy
from raysleuth.stacks.capture import dump_stacks, is_own_actor
from raysleuth.stacks.model import (
    Culprit,
    Frame,
    Missing,
    ProcessStack,
    StackGroup,
    StackReport,
    StackVerdict,
    ThreadStack,
    WaitLink,
)
from raysleuth.stacks.rules import stalled_ranks_rule
from raysleuth.stacks.verdict import EXTRA_RULES, VerdictContext, build_verdict

__all__ = [
    "EXTRA_RULES",
    "Culprit",
    "Frame",
    "Missing",
    "ProcessStack",
    "StackGroup",
    "StackReport",
    "StackVerdict",
    "ThreadStack",
    "VerdictContext",
    "WaitLink",
    "build_verdict",
    "dump_stacks",
    "group_processes",
    "headline",
    "is_own_actor",
    "parse_py_spy",
    "record_report",
    "stalled_ranks_rule",
]


def record_report(report: StackReport, *, name: str = "stacks") -> None:
    """Store a report as ``stack_report`` evidence (never raises)."""
    try:
        level = "ERROR" if report.verdict.problem else "INFO"
        record("stack_report", report.to_dict(), name=name, level=level)
    except Exception:
        pass
