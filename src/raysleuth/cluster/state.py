"""Ray's State API, listed as typed records (:mod:`raysleuth.cluster.records`).

Every other module asks this one for nodes, workers, actors and tasks. A
listing that hit the State API's limit says so (:class:`Listing.truncated`);
nothing is cut silently.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from raysleuth.cluster.records import (
    RayActor,
    RayNode,
    RayObject,
    RayPlacementGroup,
    RayTask,
    RayWorker,
    task_filters,
)
from raysleuth.errors import ClusterUnreachable

__all__ = ["Listing", "actors", "available_resources", "dead_workers", "death_reason", "get_task", "head_node",
           "list_log_files", "log_file", "nodes", "objects", "placement_groups", "rank_from_name", "tasks",
           "worker_log", "workers"]

STATE_LIMIT = 10_000


@dataclasses.dataclass
class Listing:
    """A State API listing of records, and whether it was cut at the limit."""

    items: list[Any]
    truncated: bool = False
    total: int | None = None

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _state():
    from ray.util import state

    return state


def _to_dict(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return dataclasses.asdict(item)
    return dict(item)


def _state_address() -> str | None:
    """The connected cluster's GCS address, so the State API never guesses
    ("auto" fails when several Ray clusters run on one machine)."""
    try:
        import ray

        return ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    except Exception:
        return None


def _listing(function, *, record, filters=None, limit: int = STATE_LIMIT, detail: bool = False,
             timeout: int = 30) -> Listing:
    """One State API listing, each row built into ``record`` (a ``from_state``)."""
    try:
        items = function(address=_state_address(), filters=filters, limit=limit, detail=detail, timeout=timeout,
                         raise_on_missing_output=False)
    except Exception as error:
        raise ClusterUnreachable(f"Ray's State API did not answer ({type(error).__name__}: {str(error)[:200]})",
                                 fix="the dashboard process serves the State API: check it runs (`ray status`)") from None
    items = [record(_to_dict(item)) for item in items]
    return Listing(items=items, truncated=len(items) >= limit, total=len(items))


def nodes(*, alive_only: bool = False) -> list[RayNode]:
    """Every node: node_id, node_ip, is_head_node, alive, resources_total, labels (``to_dict()``: the same keys)."""
    import ray

    found = [RayNode.from_state(node) for node in ray.nodes()]
    return [node for node in found if node.alive or not alive_only]


def head_node() -> RayNode | None:
    """The head node, from :func:`nodes`."""
    return next((node for node in nodes() if node.is_head_node), None)


def workers(*, alive_only: bool = True, limit: int = STATE_LIMIT) -> Listing:
    """Ray worker processes (drivers included), as :class:`RayWorker`."""
    filters = [("is_alive", "=", "True")] if alive_only else None
    return _listing(_state().list_workers, filters=filters, limit=limit, detail=True, record=RayWorker.from_state)


def dead_workers(*, limit: int = STATE_LIMIT) -> Listing:
    """Worker processes that are gone (:class:`RayWorker` with exit_type, exit_detail, end_time_ms)."""
    return _listing(_state().list_workers, filters=[("is_alive", "=", "False")], limit=limit, detail=True,
                    record=RayWorker.from_state)


def actors(*, state: str | None = None, limit: int = STATE_LIMIT, detail: bool = True) -> Listing:
    """Actors, as :class:`RayActor` (the death cause with ``detail``)."""
    filters = [("state", "=", state)] if state else None
    return _listing(_state().list_actors, filters=filters, limit=limit, detail=detail, record=RayActor.from_state)


def tasks(*, state: str | None = None, limit: int = STATE_LIMIT, detail: bool = True, filters=None,
          not_states: tuple[str, ...] = (), name: str | None = None, actor_id: str | None = None,
          worker_pid: int | None = None, node_id: str | None = None, job_id: str | None = None) -> Listing:
    """Tasks and actor calls from the task events (the newest attempt of each), as :class:`RayTask`.

    Filtered by the State API (``state``, none of ``not_states``, the task
    ``name``, the ``actor_id``, the ``job_id``: by the GCS itself; the worker ``worker_pid``
    on ``node_id``: by the dashboard, after the GCS sent every task): a
    long-lived cluster keeps many thousands of finished tasks, and listing
    them all takes seconds and is cut at ``limit`` before the ones asked for.
    """
    filters = list(filters or []) + task_filters(state=state, not_states=not_states, name=name, actor_id=actor_id,
                                                 worker_pid=worker_pid, node_id=node_id, job_id=job_id)
    return _listing(_state().list_tasks, filters=filters or None, limit=limit, detail=detail,
                    record=RayTask.from_state)


def placement_groups(*, limit: int = STATE_LIMIT) -> Listing:
    """Placement groups with their bundles and state, as :class:`RayPlacementGroup`."""
    return _listing(_state().list_placement_groups, limit=limit, detail=True, record=RayPlacementGroup.from_state)


def objects(*, reference_type: str | None = None, limit: int = STATE_LIMIT) -> Listing:
    """Object references (who holds each, and why), as :class:`RayObject`."""
    filters = [("reference_type", "=", reference_type)] if reference_type else None
    return _listing(_state().list_objects, filters=filters, limit=limit, detail=True, record=RayObject.from_state)


def available_resources() -> dict[str, float]:
    """Resources free right now across the cluster (Ray's own view; not per node)."""
    import ray

    try:
        return {key: value for key, value in ray.available_resources().items() if not key.startswith("node:")}
    except Exception:
        return {}


def get_task(task: Any) -> list[RayTask]:
    """Every attempt of one task (id string or ObjectRef), oldest attempt first."""
    try:
        found = _state().get_task(task, address=_state_address(), timeout=30)
    except Exception as error:
        raise ClusterUnreachable(f"Ray's State API did not answer ({type(error).__name__}: {str(error)[:200]})",
                                 fix="check the dashboard runs (`ray status`)") from None
    if found is None:
        return []
    items = found if isinstance(found, list) else [found]
    return sorted((RayTask.from_state(_to_dict(item)) for item in items), key=lambda item: item.attempt_number)


def worker_log(*, actor_id: str | None = None, pid: int | None = None, node_id: str | None = None,
               suffix: str = "out", tail: int = 1000, timeout: int = 30) -> list[str]:
    """The last ``tail`` lines of a worker's Ray log (``suffix`` ``out`` or ``err``).

    By actor id (Ray finds its node), or by pid on ``node_id``. Raises
    :class:`ClusterUnreachable` when the State API cannot serve the file.
    """
    try:
        lines = _state().get_log(address=_state_address(), actor_id=actor_id, pid=None if actor_id else pid,
                                 node_id=None if actor_id else node_id, suffix=suffix, tail=tail,
                                 timeout=timeout, errors="replace")
        text = "".join(lines)
    except Exception as error:
        raise ClusterUnreachable(f"Ray's State API could not read the {suffix} log of "
                                 f"{'actor ' + str(actor_id) if actor_id else 'pid ' + str(pid)} "
                                 f"({type(error).__name__}: {str(error)[:200]})",
                                 fix="the worker may have died long ago and its log been rotated; "
                                     "check `ray list logs` on its node") from None
    return text.splitlines()


def log_file(*, node_id: str, filename: str, tail: int = 1000, timeout: int = 30) -> list[str]:
    """The last ``tail`` lines of a file in a node's Ray logs folder (e.g. ``train/ray-train-sys-...``).

    Raises :class:`ClusterUnreachable` when the State API cannot serve it (absent file included).
    """
    try:
        lines = _state().get_log(address=_state_address(), node_id=node_id, filename=filename, tail=tail,
                                 timeout=timeout, errors="replace")
        text = "".join(lines)
    except Exception as error:
        raise ClusterUnreachable(f"Ray's State API could not read {filename} on node {node_id[:12]} "
                                 f"({type(error).__name__}: {str(error)[:200]})",
                                 fix="check the file exists with `ray list logs` on that node") from None
    return text.splitlines()


def list_log_files(*, node_id: str | None = None, glob_filter: str | None = None,
                   timeout: int = 30) -> dict[str, list[str]]:
    """Ray's log files on a node (default: the head), by category, from the State API."""
    if node_id is None:
        head = head_node()
        node_id = head.node_id if head else None
    try:
        return dict(_state().list_logs(address=_state_address(), node_id=node_id, glob_filter=glob_filter,
                                       timeout=timeout))
    except Exception as error:
        raise ClusterUnreachable(f"Ray's State API could not list logs ({type(error).__name__}: {str(error)[:200]})",
                                 fix="check the dashboard runs (`ray status`)") from None


def death_reason(actor: RayActor | Mapping[str, Any]) -> tuple[str, bool]:
    """A dead actor's cause in one line, and whether it was ended on purpose (``ray.kill``, its job ended).

    ``actor``: its record, or the State API row it is built from.
    """
    cause = (actor if isinstance(actor, RayActor) else RayActor.from_state(actor)).death
    reason = str(cause.reason or "")
    message = cause.error_message.strip()
    first = message.split(". Some common causes", 1)[0].replace("The actor is dead because ", "")
    on_purpose = reason in ("RAY_KILL", "OWNER_DIED", "OUT_OF_SCOPE", "REF_DELETED", "NODE_DIED_INTENDED") or (
        "ray.kill" in message) or "INTENDED_USER_EXIT" in first.split("Worker exit detail")[0]
    text = (f"{reason}: {first}" if reason else first)[:300] or "died (no cause recorded)"
    return text, on_purpose


# ------------------------------------------------------------------- ranks

_RANK_PATTERNS = (
    re.compile(r"(?:^|[_\-:/.])rank[_\-:]?(\d+)$", re.IGNORECASE),
    re.compile(r":(\d+)$"),  # verl: <prefix><Class>_<pg>:<local_rank>
)


def rank_from_name(name: str | None) -> int | None:
    """A rank written into an actor name (``trainer_rank3``, ``...WorkerDict_0:3``), else None."""
    if not name:
        return None
    for pattern in _RANK_PATTERNS:
        match = pattern.search(name)
        if match:
            return int(match.group(1))
    return None


