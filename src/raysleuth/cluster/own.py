"""raysleuth's own actors (the evidence writer, the node agents): one list, for every caller that must leave
them out of what it shows the user (stacks, tasks, deaths, memory sampling, the death watch).

Names only, no import of the recorder or the agents (both sit beside this package and import it).
"""

from __future__ import annotations

__all__ = ["AGENT_PREFIX", "NAMESPACE", "OWN_CLASSES", "OWN_TASK_EVENTS", "WRITER_NAME", "is_own", "is_own_title"]

NAMESPACE = "raysleuth"
"""The Ray namespace every raysleuth actor lives in."""
WRITER_NAME = "raysleuth-writer"
"""The run's evidence writer (one per cluster)."""
AGENT_PREFIX = "raysleuth-agent-"
"""Each node agent's name: this prefix and the first 16 characters of its node id."""
OWN_CLASSES = ("EvidenceWriter", "NodeAgent")
"""Their classes."""
OWN_TASK_EVENTS = False
"""Whether Ray records task events for their calls (``enable_task_events``). Off: every worker's control poll,
every delivery and every meeting is a call on them, several a second per rank. Recorded, those calls fill the
GCS's task-event store (``RAY_task_events_max_num_task_in_gcs``, 100,000) and evict the job's own tasks, which
``raysleuth tasks``, ``trace`` and the stacks verdict read, and they would crowd ``ray list tasks``."""


def is_own(*, name: str | None = None, class_name: str | None = None, namespace: str | None = None) -> bool:
    """An actor, or a call of one, that raysleuth runs: by its name, its class (``module.Class`` or
    ``Class.method`` forms too) or its namespace."""
    if namespace == NAMESPACE:
        return True
    if name and (name == WRITER_NAME or name.startswith(AGENT_PREFIX)):
        return True
    text = class_name or ""
    return bool(text) and (text.split(".")[0] in OWN_CLASSES or text.rsplit(".", 1)[-1] in OWN_CLASSES)


def is_own_title(title: str) -> bool:
    """A process title (``ray::NodeAgent.run_tool``) of one of raysleuth's actors."""
    return any(title.startswith(f"ray::{own}") for own in OWN_CLASSES)
