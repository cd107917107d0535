"""Every private Ray name raysleuth relies on, each behind a guard, in one place.

raysleuth is tested on the Ray range pinned in ``pyproject.toml``. A Ray
upgrade that renames or removes one of these fails here with
:class:`RayInternalsChanged`, which names the missing piece, the installed
Ray version and the tested range, instead of a silent no-op or an
``AttributeError`` deep in a feature. ``tests/test_ray_private.py`` checks
each accessor against the installed Ray on its own.

What raysleuth uses, and why:

- ``ray._raylet.GcsClient``: the token-less GCS probe (fail fast on auth);
- ``ray._raylet.Config.initialize``: re-read Ray's config after switching
  this process to token mode;
- ``ray._private.services``: find a running cluster's address;
- ``ray._private.worker.global_worker`` and its ``debugger_port``,
  ``function_actor_manager._function_execution_info`` (executor closures
  of actor methods) and ``_make_actor_method_executor`` (the zero-code
  setup wraps the methods a worker runs), ``get_dashboard_url``;
- ``ray._private.worker._global_node``: this process's Ray logs folder;
- ``ray._private.state.jobs``: which jobs (drivers) are alive, from the GCS
  (the writer retires the node agents once no job that used raysleuth is);
- ``RemoteFunction._remote``, ``ActorMethod._remote``: detailed Ray-call
  tracing wraps the submission paths (and labels each call from the
  descriptors Ray keeps on them); ``RemoteFunction._function``: crash
  capture wraps a remote function in place;
- ``ActorHandle.__ray_call__`` and ``ActorHandle._actor_id``: run a function
  on a live actor instance without changing its class; ``ActorMethod._actor``:
  which actor a traced call went to; ``ActorHandle._ray_actor_creation_function_descriptor``:
  the class behind a handle (labels);
- ``FunctionActorManager._make_actor_method_executor``: the zero-code setup
  rebuilds an actor method's executor around the wrapped method;
- ``ray.train.v2._internal.execution.worker_group.thread_runner``: where Ray
  Train (v2) sees the user's training function raise;
- the ``node:__internal_head__`` resource: pin the evidence writer to the
  head node.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from raysleuth.errors import RaySleuthError

__all__ = [
    "HEAD_NODE_RESOURCE",
    "RayInternalsChanged",
    "actor_class_name",
    "actor_id_hex",
    "actor_of_method",
    "actor_method_executor_maker",
    "config_initialize",
    "dashboard_url",
    "gcs_client_class",
    "global_node",
    "global_worker",
    "function_execution_table",
    "is_ray_worker_process",
    "live_jobs",
    "ray_call",
    "ray_train_thread_runner",
    "remote_function_body",
    "require",
    "services",
    "set_remote_function_body",
    "submission_classes",
    "submission_label",
]

#: The resource only the head node has (Ray sets it): used to pin the evidence writer there.
HEAD_NODE_RESOURCE = "node:__internal_head__"

TESTED_RAY = ">=2.60,<2.61"
UPGRADE_FIX = f"install the Ray raysleuth is tested on: pip install 'ray[default]{TESTED_RAY}'"


class RayInternalsChanged(RaySleuthError):
    """A private Ray name raysleuth needs is missing from the installed Ray."""


def _ray_version() -> str:
    try:
        import ray

        return ray.__version__
    except Exception:  # ray missing or broken
        return "not importable"


def require(module: str, *path: str) -> Any:
    """``module.path[0].path[1]...``, or :class:`RayInternalsChanged` naming what is missing and the Ray version."""
    dotted = ".".join((module, *path))
    try:
        value: Any = importlib.import_module(module)
        for part in path:
            value = getattr(value, part)
    except (ImportError, AttributeError) as error:
        raise RayInternalsChanged(
            f"raysleuth needs Ray's private `{dotted}`, which Ray {_ray_version()} does not have "
            f"({type(error).__name__}: {error})",
            fix=UPGRADE_FIX,
        ) from None
    return value


def gcs_client_class() -> Any:
    """``ray._raylet.GcsClient``."""
    return require("ray._raylet", "GcsClient")


def config_initialize(config: str = "") -> None:
    """``ray._raylet.Config.initialize(config)``: make this process re-read Ray's settings."""
    require("ray._raylet", "Config", "initialize")(config)


def services() -> Any:
    """``ray._private.services`` (address discovery)."""
    return require("ray._private.services")


def global_worker() -> Any:
    """``ray._private.worker.global_worker``: this process's Ray worker."""
    return require("ray._private.worker", "global_worker")


def is_ray_worker_process() -> bool:
    """Whether this process is a Ray worker (a task or actor process), read from Python state alone.

    Never calls into Ray's core worker: at a worker's interpreter exit the core
    worker is already gone, and any call into it from then on ends the process
    at once (Ray's ``QuickExit``), skipping the rest of Python's exit.
    """
    try:
        ray, worker = sys.modules.get("ray"), sys.modules.get("ray._private.worker")  # never imports Ray
        return ray is not None and worker is not None and getattr(worker.global_worker, "mode", None) == ray.WORKER_MODE
    except Exception:
        return False


def live_jobs() -> set[str]:
    """The ids (hex) of the jobs whose driver is alive, from the GCS's job table (``ray._private.state.jobs``)."""
    table = require("ray._private.state", "jobs")()
    try:
        return {str(job["JobID"]) for job in table if not job["IsDead"]}
    except (KeyError, TypeError) as error:
        raise RayInternalsChanged(f"raysleuth reads `JobID` and `IsDead` from Ray's job table, which Ray "
                                  f"{_ray_version()} spells otherwise ({error})", fix=UPGRADE_FIX) from None


def global_node() -> Any:
    """``ray._private.worker._global_node``: this process's Ray node (None outside a Ray process)."""
    return require("ray._private.worker", "_global_node")


def dashboard_url() -> str | None:
    """``ray._private.worker.get_dashboard_url()``."""
    return require("ray._private.worker", "get_dashboard_url")() or None


def function_execution_table() -> dict[Any, Any]:
    """The worker's table of executors for actor methods (their closures hold the user's methods)."""
    manager = global_worker().function_actor_manager
    table = getattr(manager, "_function_execution_info", None)
    if table is None:
        raise RayInternalsChanged(
            f"raysleuth needs Ray's private `FunctionActorManager._function_execution_info`, which Ray "
            f"{_ray_version()} does not have",
            fix=UPGRADE_FIX)
    return table


def actor_method_executor_maker() -> Any:
    """``FunctionActorManager._make_actor_method_executor(name, method)``: an actor method's executor."""
    maker = getattr(global_worker().function_actor_manager, "_make_actor_method_executor", None)
    if maker is None:
        raise RayInternalsChanged(
            f"raysleuth needs Ray's private `FunctionActorManager._make_actor_method_executor`, which Ray "
            f"{_ray_version()} does not have",
            fix=UPGRADE_FIX)
    return maker


RAY_TRAIN_THREAD_RUNNER = "ray.train.v2._internal.execution.worker_group.thread_runner"


def ray_train_thread_runner() -> Any:
    """Ray Train (v2)'s thread runner module where this worker has loaded it, else None (never imports it)."""
    import sys

    return sys.modules.get(RAY_TRAIN_THREAD_RUNNER)


def actor_of_method(method: Any) -> Any:
    """The actor handle an ``ActorMethod`` calls (``ActorMethod._actor``)."""
    actor = getattr(method, "_actor", None)
    if actor is None:
        raise RayInternalsChanged(
            f"raysleuth needs `ActorMethod._actor`, which Ray {_ray_version()} does not have", fix=UPGRADE_FIX)
    return actor


def remote_function_body(target: Any) -> Any:
    """The user's function inside a ``RemoteFunction`` (``_function``), or None when ``target`` is not one.

    Never imports Ray: a process that has not imported it holds no remote function.
    """
    import sys

    module = sys.modules.get("ray.remote_function")
    remote_function = getattr(module, "RemoteFunction", None)
    if remote_function is None or not isinstance(target, remote_function):
        return None
    body = getattr(target, "_function", None)
    if not callable(body):
        raise RayInternalsChanged(
            f"raysleuth needs `RemoteFunction._function`, which Ray {_ray_version()} does not have",
            fix=UPGRADE_FIX)
    return body


def set_remote_function_body(target: Any, body: Any) -> bool:
    """Replace a ``RemoteFunction``'s function before it is shipped; False when it was already shipped."""
    shipped = getattr(target, "_pickled_function", None) is not None
    target._function = body
    return not shipped


def actor_class_name(handle: Any) -> str:
    """The class name of the actor behind a handle (``ActorHandle._ray_actor_creation_function_descriptor``)."""
    descriptor = getattr(handle, "_ray_actor_creation_function_descriptor", None)
    if descriptor is None:
        raise RayInternalsChanged(
            f"raysleuth needs `ActorHandle._ray_actor_creation_function_descriptor`, which Ray {_ray_version()} "
            "does not have", fix=UPGRADE_FIX)
    return descriptor.class_name.rsplit(".", 1)[-1]


def submission_label(kind: str, target: Any) -> str:
    """``module.function`` of a traced task, ``Class.method`` of a traced actor call; a plain name if Ray moved.

    Reads ``RemoteFunction._function_descriptor``, ``ActorMethod._actor``,
    ``ActorHandle._ray_actor_creation_function_descriptor`` and
    ``ActorMethod._method_name``: a label only, so a Ray without them gives
    the bare name instead of an error.
    """
    try:
        if kind == "task":
            descriptor = target._function_descriptor
            return f"{descriptor.module_name}.{descriptor.function_name}".rsplit(".", 2)[-1] \
                if descriptor.function_name else "task"
        return f"{actor_class_name(actor_of_method(target))}.{target._method_name}"
    except Exception:
        return str(getattr(target, "_method_name", None) or getattr(target, "__name__", kind))


def submission_classes() -> tuple[Any, Any]:
    """``(RemoteFunction, ActorMethod)``, each checked to have the ``_remote`` detailed tracing wraps."""
    remote_function = require("ray.remote_function", "RemoteFunction")
    actor_method = require("ray.actor", "ActorMethod")
    require("ray.remote_function", "RemoteFunction", "_remote")
    require("ray.actor", "ActorMethod", "_remote")
    return remote_function, actor_method


def ray_call(handle: Any, function: Any, *args: Any) -> Any:
    """``handle.__ray_call__.remote(function, *args)``: run ``function(actor_instance, *args)`` in the actor."""
    method = getattr(handle, "__ray_call__", None)
    if method is None:
        raise RayInternalsChanged(
            f"raysleuth needs `ActorHandle.__ray_call__` to reach a live actor, which Ray {_ray_version()} "
            f"does not have on {type(handle).__name__}",
            fix=UPGRADE_FIX)
    return method.remote(function, *args)


def actor_id_hex(handle: Any) -> str:
    """The actor id of a handle, as hex (``ActorHandle._actor_id``)."""
    actor_id = getattr(handle, "_actor_id", None)
    if actor_id is None or not hasattr(actor_id, "hex"):
        raise RayInternalsChanged(
            f"raysleuth needs `ActorHandle._actor_id`, which Ray {_ray_version()} does not have",
            fix=UPGRADE_FIX)
    return actor_id.hex()
