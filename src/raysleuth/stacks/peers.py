"""Peers are one role in one group: one Ray Train run, one verl worker group, one job.

Pure logic. Two processes with one rank number in different groups or
jobs are different ranks, and processes are never grouped by class name
alone: verl names every pool's class ``WorkerDict``, and every job has its
ranks 0..n-1.

The group of an actor process, most specific first:

- a verl worker group: its actor name ``<prefix><Class>_<pg>:<local rank>``
  without the placement-group index and rank (the prefix is random per group);
- a named actor whose name ends in a rank (``trainer_rank3``, ``ddp-2``):
  the name without it;
- else its actor class;

always within its Ray job.
"""

from __future__ import annotations

import re
from collections import defaultdict

from raysleuth.stacks.model import ProcessStack

__all__ = ["assign_groups", "group_key", "group_of", "peer_groups"]

_VERL_NAME = re.compile(r"^(?P<group>.+?)_\d+:\d+$")
_RANKED_NAME = re.compile(r"^(?P<group>.*?)[_\-:.]?(?:rank)?[_\-:]?\d+$", re.IGNORECASE)


def group_of(process: ProcessStack) -> str | None:
    """The peer group of an actor process, or None (drivers, tasks, children, unnamed workers)."""
    if process.role != "actor":
        return None
    return group_key(process.actor_class, process.actor_name, process.job_id)


def group_key(actor_class: str | None, actor_name: str | None, job_id: str | None) -> str | None:
    """The peer group of an actor of this class and name in this job (a dead one too)."""
    if not (actor_class or actor_name):
        return None
    job = f"job {job_id}" if job_id else "job ?"
    name = actor_name or ""
    verl = _VERL_NAME.match(name)
    if verl:
        return f"{job} / verl group {verl.group('group')}"
    ranked = _RANKED_NAME.match(name) if name else None
    if ranked and ranked.group("group"):
        return f"{job} / {ranked.group('group')}"
    return f"{job} / {actor_class or name}"


def assign_groups(processes: list[ProcessStack]) -> None:
    """Set ``process.group`` on every process."""
    for process in processes:
        process.group = group_of(process)


def peer_groups(processes: list[ProcessStack]) -> dict[str, list[ProcessStack]]:
    """Groups of two or more readable peers, by :func:`group_of` (set ``process.group`` first)."""
    groups: dict[str, list[ProcessStack]] = defaultdict(list)
    for process in processes:
        key = process.group if process.group is not None else group_of(process)
        if key and process.threads:
            groups[key].append(process)
    return {name: peers for name, peers in groups.items() if len(peers) >= 2}
