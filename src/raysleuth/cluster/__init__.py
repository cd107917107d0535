"""Connect to Ray (or start one) and read its state. The only door to Ray's State API.

- :mod:`~raysleuth.cluster.connection` — address, token authentication, connect / start, session;
- :mod:`~raysleuth.cluster.records` — typed records (:class:`RayTask`, :class:`RayActor`,
  :class:`RayNode`, :class:`RayWorker`), the only reader of Ray's State API field names;
- :mod:`~raysleuth.cluster.state` — the listings, returning records, and Ray's log files;
- :mod:`~raysleuth.cluster.worker` — private Ray hooks used inside a worker (zero-code setup).

Callers use the package: ``from raysleuth import cluster; cluster.actors(state="DEAD")``.
"""

from __future__ import annotations

from raysleuth.cluster.connection import (
    _PROBE_NOISE,
    DEFAULT_NAMESPACE,
    ClusterInfo,
    choose,
    cluster_auth_mode,
    connect,
    find_auth_token,
    on_connect,
    pin_address,
    resolve_address,
    session_name,
    shutdown,
    start_local,
    tcp_problem,
)
from raysleuth.cluster.discovery import AddressChoice, LocalCluster, local_clusters
from raysleuth.cluster.records import (
    RayActor,
    RayDeathCause,
    RayNode,
    RayObject,
    RayPlacementGroup,
    RayTask,
    RayTaskEvent,
    RayWorker,
    runtime_env_vars,
)
from raysleuth.cluster.state import (
    STATE_LIMIT,
    Listing,
    actors,
    available_resources,
    dead_workers,
    death_reason,
    get_task,
    head_node,
    list_log_files,
    log_file,
    nodes,
    objects,
    placement_groups,
    rank_from_name,
    tasks,
    worker_log,
    workers,
)
from raysleuth.cluster.worker import current_job_id, local_logs_dir, on_ray_train_user_error, wrap_worker_calls

__all__ = [
    "AddressChoice",
    "ClusterInfo",
    "DEFAULT_NAMESPACE",
    "Listing",
    "LocalCluster",
    "RayActor",
    "RayDeathCause",
    "RayNode",
    "RayObject",
    "RayPlacementGroup",
    "RayTask",
    "RayTaskEvent",
    "RayWorker",
    "STATE_LIMIT",
    "actors",
    "available_resources",
    "choose",
    "cluster_auth_mode",
    "connect",
    "current_job_id",
    "dead_workers",
    "death_reason",
    "find_auth_token",
    "get_task",
    "head_node",
    "list_log_files",
    "local_clusters",
    "local_logs_dir",
    "log_file",
    "nodes",
    "objects",
    "on_connect",
    "on_ray_train_user_error",
    "pin_address",
    "placement_groups",
    "rank_from_name",
    "resolve_address",
    "runtime_env_vars",
    "session_name",
    "shutdown",
    "start_local",
    "tasks",
    "tcp_problem",
    "worker_log",
    "workers",
    "wrap_worker_calls",
]
