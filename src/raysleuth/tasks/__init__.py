"""Task forensics: why each task waits, which calls are stuck, what failed, which actors died.

:func:`find_tasks` reads the State API once (tasks, actors, placement
groups, nodes, and object references when something waits on arguments)
and returns a :class:`TaskReport` (modules: ``find`` reads, ``pending`` explains
waits, ``classify`` is the pure logic, ``model`` the dataclasses):

- ``pending`` — every task, actor creation and placement group that has not
  started, with *why it waits* (:data:`REASONS`) and for how long;
- ``stuck`` — running calls far slower than their peers of the same function
  (robust statistics, :func:`raysleuth.tasks.classify.is_stuck`);
- ``failed`` — failed tasks with the error type and, when ``raysleuth.explain``
  knows it, a cause and fix;
- ``deaths`` — every dead actor and task worker as a :class:`raysleuth.deaths.Death`
  (rank, classified cause, evidence, Ray's own reason); ``dead_actors`` the actors among them.

A listing cut at the State API's limit sets ``truncated`` and says which one.
:func:`trace_ray_task` (in :mod:`raysleuth.tasks.lifecycle`) is one task's life.
"""

from __future__ import annotations

from raysleuth.tasks.find import find_tasks
from raysleuth.tasks.lifecycle import LifecyclePhase, TaskAttempt, TaskTrace, trace_ray_task
from raysleuth.tasks.model import REASONS, DeadActor, FailedTask, PendingTask, StuckTask, TaskReport

__all__ = [
    "DeadActor",
    "FailedTask",
    "LifecyclePhase",
    "PendingTask",
    "REASONS",
    "StuckTask",
    "TaskAttempt",
    "TaskReport",
    "TaskTrace",
    "find_tasks",
    "trace_ray_task",
]
