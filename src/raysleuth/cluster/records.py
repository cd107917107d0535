"""Typed records of what Ray's State API lists: the only reader of its field names.

Each record is built once, by ``from_state(dict)``, from one State API row
(``list_tasks``, ``list_actors``, ``list_workers``; ``ray.nodes()`` for
nodes) and keeps that row in ``raw`` for JSON output (:meth:`to_dict`).
Features read attributes; a Ray upgrade that renames a field touches this
file only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from raysleuth import ray_private

__all__ = ["RayActor", "RayDeathCause", "RayNode", "RayObject", "RayPlacementGroup", "RayTask", "RayTaskEvent", "RayWorker",
           "runtime_env_vars", "task_filters"]

_FIELD = dataclasses.field


def _dict(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return {}
    return dict(value) if isinstance(value, Mapping) else {}


def _resources(value: Any) -> dict[str, float]:
    return {str(key): float(amount) for key, amount in _dict(value).items()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Record:
    raw: Mapping[str, Any] = _FIELD(default_factory=dict, repr=False, compare=False)
    """The State API row this record was built from (what JSON output shows)."""

    def to_dict(self) -> dict[str, Any]:
        """The State API row, JSON-ready (the keys Ray gave)."""
        return dict(self.raw)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayTaskEvent:
    """One state change of a task attempt (State API ``events``)."""

    state: str | None
    created_ms: float | None


def task_filters(*, state: str | None = None, not_states: tuple[str, ...] = (), name: str | None = None,
                 actor_id: str | None = None, worker_pid: int | None = None,
                 node_id: str | None = None, job_id: str | None = None) -> list[tuple[str, str, str]]:
    """State API filters for a task listing (ANDed; Ray's column names stay in this module).

    The GCS itself filters on state, name, actor id and job id (and task id);
    ``worker_pid`` and ``node_id`` are applied by the dashboard after the
    GCS sent every task, so they save the transfer to the caller only.
    """
    filters = [("state", "=", state)] if state else []
    filters += [("state", "!=", other) for other in not_states]
    filters += [(column, "=", str(value)) for column, value in
                (("name", name), ("actor_id", actor_id), ("job_id", job_id), ("worker_pid", worker_pid),
                 ("node_id", node_id)) if value]
    return filters


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayTask(_Record):
    """One task or actor call (its newest attempt, or one attempt from ``get_task``)."""

    task_id: str
    name: str | None
    function: str | None
    """``func_or_class_name``: the function, or ``Class.method``."""
    state: str | None
    type: str | None
    job_id: str | None = None
    actor_id: str | None = None
    node_id: str | None = None
    worker_id: str | None = None
    worker_pid: int | None = None
    parent_task_id: str | None = None
    placement_group_id: str | None = None
    required_resources: dict[str, float] = _FIELD(default_factory=dict)
    error_type: str | None = None
    error_message: str | None = None
    attempt_number: int = 0
    creation_time_ms: float | None = None
    start_time_ms: float | None = None
    end_time_ms: float | None = None
    events: tuple[RayTaskEvent, ...] = ()
    profile_events: tuple[dict[str, Any], ...] = ()
    """``profiling_data.events``: ``{"event", "start", "end", "extra"}`` each."""

    @classmethod
    def from_state(cls, row: Mapping[str, Any]) -> RayTask:
        events = tuple(RayTaskEvent(state=entry.get("state"), created_ms=entry.get("created_ms"))
                       for entry in row.get("events") or [] if isinstance(entry, Mapping))
        profile = tuple({"event": event.get("event_name"),
                         "start": event.get("start_time") or event.get("start_time_ms"),
                         "end": event.get("end_time") or event.get("end_time_ms"),
                         "extra": event.get("extra_data")}
                        for event in _dict(row.get("profiling_data")).get("events") or [])
        return cls(
            raw=row, task_id=row.get("task_id") or "", name=row.get("name"), function=row.get("func_or_class_name"),
            state=row.get("state"), type=row.get("type"), job_id=row.get("job_id"), actor_id=row.get("actor_id"),
            node_id=row.get("node_id"), worker_id=row.get("worker_id"), worker_pid=row.get("worker_pid"),
            parent_task_id=row.get("parent_task_id"), placement_group_id=row.get("placement_group_id") or None,
            required_resources=_resources(row.get("required_resources")), error_type=row.get("error_type"),
            error_message=row.get("error_message"), attempt_number=row.get("attempt_number") or 0,
            creation_time_ms=row.get("creation_time_ms"), start_time_ms=row.get("start_time_ms"),
            end_time_ms=row.get("end_time_ms"), events=events, profile_events=profile,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayDeathCause:
    """A dead actor's ``death_cause``, whichever context Ray filled."""

    kind: str | None = None
    """``died`` (actor_died_error_context), ``creation_failed``, ``unschedulable``,
    ``runtime_env_failed``, ``oom`` (oom_context), or None when Ray recorded nothing."""
    reason: str | None = None
    """Ray's reason (``RAY_KILL``, ``WORKER_DIED``...) from the died context."""
    error_message: str = ""
    formatted_exception: str | None = None
    never_started: bool = False
    owner_id: str | None = None
    owner_ip: str | None = None
    text: str = ""
    """The whole cause as text (for a search through everything Ray said)."""

    _CONTEXTS = (("creation_task_failure_context", "creation_failed"), ("actor_unschedulable_context", "unschedulable"),
                 ("runtime_env_failed_context", "runtime_env_failed"), ("oom_context", "oom"),
                 ("actor_died_error_context", "died"))

    @classmethod
    def from_state(cls, value: Any) -> RayDeathCause:
        cause = _dict(value)
        if not cause:
            return cls()
        kind, context = next(((kind, _dict(cause[key])) for key, kind in cls._CONTEXTS if key in cause), (None, {}))
        died = _dict(cause.get("actor_died_error_context"))
        return cls(kind=kind, reason=died.get("reason") or None,
                   error_message=str(context.get("error_message") or cause.get("error_message") or ""),
                   formatted_exception=context.get("formatted_exception_string"),
                   never_started=bool(died.get("never_started")), owner_id=died.get("owner_id"),
                   owner_ip=died.get("owner_ip_address"), text=str(cause))

    @property
    def recorded(self) -> bool:
        """Whether Ray recorded any cause."""
        return bool(self.text)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayActor(_Record):
    """One actor."""

    actor_id: str
    class_name: str | None
    name: str | None
    state: str | None
    pid: int | None = None
    node_id: str | None = None
    job_id: str | None = None
    namespace: str | None = None
    required_resources: dict[str, float] = _FIELD(default_factory=dict)
    num_restarts: int = 0
    death: RayDeathCause = _FIELD(default_factory=RayDeathCause)
    env_vars: dict[str, str] = _FIELD(default_factory=dict)
    """The ``env_vars`` of its creation ``runtime_env``."""

    @classmethod
    def from_state(cls, row: Mapping[str, Any]) -> RayActor:
        return cls(
            raw=row, actor_id=row.get("actor_id") or "", class_name=row.get("class_name"), name=row.get("name"),
            state=row.get("state"), pid=row.get("pid"), node_id=row.get("node_id"), job_id=row.get("job_id"),
            namespace=row.get("ray_namespace"), required_resources=_resources(row.get("required_resources")),
            num_restarts=row.get("num_restarts") or 0, death=RayDeathCause.from_state(row.get("death_cause")),
            env_vars=runtime_env_vars(row),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayWorker(_Record):
    """One worker process (driver included), alive or dead."""

    worker_id: str | None
    pid: int | None
    node_id: str | None = None
    ip: str | None = None
    worker_type: str | None = None
    alive: bool = True
    exit_type: str | None = None
    exit_detail: str | None = None
    end_time_ms: float | None = None

    @classmethod
    def from_state(cls, row: Mapping[str, Any]) -> RayWorker:
        return cls(raw=row, worker_id=row.get("worker_id"), pid=row.get("pid"), node_id=row.get("node_id"),
                   ip=row.get("ip"), worker_type=row.get("worker_type"), alive=bool(row.get("is_alive", True)),
                   exit_type=row.get("exit_type"), exit_detail=row.get("exit_detail"),
                   end_time_ms=row.get("end_time_ms"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayNode(_Record):
    """One node of the cluster (from ``ray.nodes()``); :meth:`to_dict` is raysleuth's node dict."""

    node_id: str | None
    node_ip: str | None
    hostname: str | None = None
    alive: bool = False
    is_head_node: bool = False
    resources_total: dict[str, float] = _FIELD(default_factory=dict)
    labels: dict[str, str] = _FIELD(default_factory=dict)
    object_store_socket: str | None = None
    temp_dir: str | None = None

    @classmethod
    def from_state(cls, row: Mapping[str, Any]) -> RayNode:
        resources = row.get("Resources") or {}
        return cls(raw=row, node_id=row.get("NodeID"), node_ip=row.get("NodeManagerAddress"),
                   hostname=row.get("NodeManagerHostname"), alive=bool(row.get("Alive")),
                   is_head_node=ray_private.HEAD_NODE_RESOURCE in resources,
                   resources_total={k: v for k, v in resources.items() if not k.startswith("node:")},
                   labels=row.get("Labels", {}), object_store_socket=row.get("ObjectStoreSocketName"),
                   temp_dir=row.get("TempDir") or None)

    def to_dict(self) -> dict[str, Any]:
        """node_id, node_ip, hostname, alive, is_head_node, resources_total, labels, object_store_socket, temp_dir."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self) if field.name != "raw"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayPlacementGroup(_Record):
    """One placement group."""

    placement_group_id: str
    name: str | None = None
    state: str | None = None
    strategy: str | None = None
    bundles: tuple[dict[str, float], ...] = ()
    """Each bundle's resources (``unit_resources``)."""
    scheduling_state: str | None = None
    created_ns: int | None = None
    """When the GCS received its creation request."""

    @classmethod
    def from_state(cls, row: Mapping[str, Any]) -> RayPlacementGroup:
        stats = _dict(row.get("stats"))
        created = stats.get("creation_request_received_ns")
        return cls(raw=row, placement_group_id=row.get("placement_group_id") or "", name=row.get("name") or None,
                   state=row.get("state"), strategy=row.get("strategy"),
                   bundles=tuple(dict(_dict(bundle).get("unit_resources") or {}) for bundle in row.get("bundles") or []),
                   scheduling_state=stats.get("scheduling_state"), created_ns=int(created) if created else None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayObject(_Record):
    """One object reference: who holds it, and why."""

    object_id: str
    reference_type: str | None = None
    task_status: str | None = None
    pid: int | None = None
    ip: str | None = None

    @classmethod
    def from_state(cls, row: Mapping[str, Any]) -> RayObject:
        return cls(raw=row, object_id=row.get("object_id") or "", reference_type=row.get("reference_type"),
                   task_status=row.get("task_status"), pid=row.get("pid"), ip=row.get("ip"))


def runtime_env_vars(actor: Mapping[str, Any]) -> dict[str, str]:
    """The ``env_vars`` of an actor's creation ``runtime_env`` (State API ``serialized_runtime_env``)."""
    raw = _dict(actor.get("serialized_runtime_env") or actor.get("runtime_env") or {})
    env = raw.get("env_vars")
    return {str(key): str(value) for key, value in (env or {}).items()} if isinstance(env, Mapping) else {}
