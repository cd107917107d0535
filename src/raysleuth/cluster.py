"""Connect to Ray (or start one) and read its state. The only door to Ray's State API.

Every other module asks this one for nodes, workers, actors and tasks, so
differences between Ray versions stay in one file. Results are plain dicts
(JSON-ready). A listing that hit the State API's limit says so
(:class:`Listing.truncated`); nothing is cut silently.

Token authentication (Ray 2.5x turns it on for new local clusters): before
connecting we look for a token in ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``
and ``~/.ray/auth_token`` and switch this process to token mode when one
exists; a cluster that wants a token we lack fails in milliseconds with the
fix, instead of Ray's 20 s of retries. The token itself is never printed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raysleuth.errors import AuthTokenMissing, ClusterUnreachable, UsageError
from raysleuth import ray_private
from raysleuth.native_stderr import filtered_stderr

__all__ = [
    "ClusterInfo",
    "Listing",
    "actors",
    "available_resources",
    "connect",
    "current_job_id",
    "dead_workers",
    "death_reason",
    "find_auth_token",
    "get_task",
    "head_node",
    "list_log_files",
    "local_logs_dir",
    "log_file",
    "nodes",
    "objects",
    "on_ray_train_user_error",
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

DEFAULT_NAMESPACE = "raysleuth"
STATE_LIMIT = 10_000


@dataclasses.dataclass(kw_only=True)
class ClusterInfo:
    """The cluster this process is connected to."""

    address: str
    """The GCS address (ip:port)."""
    session_name: str
    """Ray's session name; also raysleuth's run id."""
    ray_version: str
    started_here: bool
    """True when raysleuth started this Ray (embedded local cluster)."""
    auth_mode: str
    """``token`` or ``disabled``."""
    auth_token_source: str | None
    """Where the token came from (never the token)."""
    dashboard_url: str | None = None
    connect_seconds: float = 0.0


@dataclasses.dataclass
class Listing:
    """A State API listing, and whether it was cut at the limit."""

    items: list[dict[str, Any]]
    truncated: bool = False
    total: int | None = None

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


# ----------------------------------------------------------------- address


def find_auth_token(env: Mapping[str, str] | None = None, home: Path | None = None) -> str | None:
    """Where a Ray auth token is available (a description, never the token)."""
    env = os.environ if env is None else env
    if env.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if path and Path(path).expanduser().is_file():
        return f"RAY_AUTH_TOKEN_PATH={path}"
    default = (home or Path.home()) / ".ray" / "auth_token"
    if default.is_file() and default.read_text().strip():
        return str(default)
    return None


def resolve_address(address: str | None) -> str | None:
    """Turn ``--address`` / ``RAY_ADDRESS`` / ``auto`` into an ip:port, or ``None``."""
    address = address or os.environ.get("RAY_ADDRESS") or "auto"
    if address.startswith("ray://"):
        raise UsageError(
            f"address {address!r} is a Ray Client address",
            fix="raysleuth needs the GCS address (ip:port, e.g. 10.0.0.1:6379) or 'auto' on a cluster node",
        )
    if address not in ("auto", "local"):
        return address
    try:
        found = ray_private.services().get_ray_address_from_environment("auto", None)
    except Exception:
        return None
    return found if found and found != "auto" else None


def tcp_problem(address: str, timeout: float = 2.0) -> str | None:
    """Why ``host:port`` does not accept a TCP connection, or ``None`` when it does."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return None
    except (ValueError, OverflowError):
        return f"{address!r} is not host:port"
    except OSError as error:
        return error.strerror or str(error)


def _enable_token_mode() -> None:
    os.environ["RAY_AUTH_MODE"] = "token"
    try:
        ray_private.config_initialize("")  # Ray caches its config: make this process see token mode
    except Exception:
        pass


def _authenticate(address: str) -> None:
    """Probe the GCS; switch to token mode only when the cluster asks for a token.

    An explicit ``RAY_AUTH_MODE`` is respected. Otherwise we first ask
    without a token (a cluster with authentication off answers), and on an
    authentication error retry with the token found locally, if any.
    """
    token_source = find_auth_token()
    if os.environ.get("RAY_AUTH_MODE") is not None:
        _probe(address, token_source if os.environ["RAY_AUTH_MODE"].lower() == "token" else None)
        return
    try:
        with filtered_stderr(_PROBE_NOISE):  # Ray's C++ auth warnings for our own token-less probe
            _probe(address, None)
    except AuthTokenMissing:
        if token_source is None:
            raise
        _enable_token_mode()
        _probe(address, token_source)


#: What Ray's C++ client prints when the token-less probe meets a token cluster (expected, not the user's problem).
_PROBE_NOISE = re.compile(r"gcs_client\.cc.*(?:InvalidAuthToken|Unauthenticated)|"
                          r"(?:InvalidAuthToken|Unauthenticated).*(?:gcs|GCS|cluster ID)")


def _probe(address: str, token_source: str | None) -> str:
    """Ask the GCS for the session name; fail fast on auth. Returns the session name."""
    GcsClient = ray_private.gcs_client_class()  # noqa: N806

    try:
        client = GcsClient(address=address)
        value = client.internal_kv_get(b"session_name", namespace=b"session", timeout=3)
    except Exception as error:
        text = f"{type(error).__name__}: {error}"
        if "Authentication" in text or "InvalidAuthToken" in text or "Unauthenticated" in text:
            if token_source is None:
                raise AuthTokenMissing(
                    f"the Ray cluster at {address} requires token authentication and no token was found",
                    fix="copy the cluster's token to ~/.ray/auth_token, or set RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN "
                    "(on the head node: `ray get-auth-token`)",
                ) from None
            raise AuthTokenMissing(
                f"the Ray cluster at {address} rejected the token from {token_source}",
                fix="use the token of this cluster (on its head node: `ray get-auth-token`)",
            ) from None
        raise ClusterUnreachable(f"the Ray GCS at {address} did not answer ({text.splitlines()[0][:200]})",
                                 fix="check the address and that the cluster is up (`ray status`)") from None
    return value.decode() if value else ""


def connect(
    address: str | None = None,
    *,
    start_local: bool = False,
    num_cpus: int | None = None,
    namespace: str | None = None,
    runtime_env: dict | None = None,
) -> ClusterInfo:
    """Connect this process to Ray (reusing a connection), or start a local one.

    ``address``: ip:port, ``auto`` (the cluster on this machine) or ``None``
    (``RAY_ADDRESS``, else ``auto``). With ``start_local`` and no cluster
    found, an embedded local Ray is started. Raises
    :class:`ClusterUnreachable` / :class:`AuthTokenMissing` with the fix.
    """
    import ray

    started = time.monotonic()
    if ray.is_initialized():
        return _info(started_here=False, seconds=time.monotonic() - started)
    wanted = address or os.environ.get("RAY_ADDRESS") or "auto"
    resolved = resolve_address(address)
    if resolved is None:
        if not start_local:
            raise ClusterUnreachable(
                f"no running Ray cluster found for address {wanted!r}",
                fix="start one (`ray start --head`), pass --address ip:port, or set RAY_ADDRESS",
            )
        return start_local(num_cpus=num_cpus, namespace=namespace, runtime_env=runtime_env)
    problem = tcp_problem(resolved)
    if problem:
        raise ClusterUnreachable(
            f"cannot reach the Ray cluster at {resolved} ({problem})",
            fix="check the address (`ray status` on the head node prints it) and that the port is open",
        )
    _authenticate(resolved)
    try:
        ray.init(address=resolved, namespace=namespace, log_to_driver=False,
                 logging_level=logging.ERROR, runtime_env=runtime_env)
    except Exception as error:
        raise ClusterUnreachable(f"ray.init(address={resolved!r}) failed: {str(error).splitlines()[0][:300]}",
                                 fix="check that this machine runs the same Ray and Python versions as the cluster") from None
    return _info(started_here=False, seconds=time.monotonic() - started)


def start_local(*, num_cpus: int | None = None, namespace: str | None = None,
                runtime_env: dict | None = None, log_to_driver: bool = True) -> ClusterInfo:
    """Start a new embedded local Ray (never attaches to a running one) and connect to it."""
    import ray

    started = time.monotonic()
    if ray.is_initialized():
        return _info(started_here=False, seconds=0.0)
    ray.init(address="local", num_cpus=num_cpus, namespace=namespace, include_dashboard=True,
             log_to_driver=log_to_driver, logging_level=logging.WARNING, runtime_env=runtime_env)
    return _info(started_here=True, seconds=time.monotonic() - started)


def _info(*, started_here: bool, seconds: float) -> ClusterInfo:
    import ray

    context = ray.get_runtime_context()
    dashboard = None
    try:
        dashboard = ray_private.dashboard_url()
    except Exception:
        pass
    return ClusterInfo(
        address=context.gcs_address,
        session_name=session_name(),
        ray_version=ray.__version__,
        started_here=started_here,
        auth_mode="token" if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else "disabled",
        auth_token_source=find_auth_token() if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else None,
        dashboard_url=dashboard,
        connect_seconds=seconds,
    )


def session_name() -> str:
    """The Ray session name of the connected cluster (raysleuth's run id)."""
    import ray

    try:
        return ray.get_runtime_context().get_session_name()
    except Exception:
        pass
    from ray.experimental import internal_kv

    value = internal_kv._internal_kv_get("session_name", namespace="session")
    return value.decode() if isinstance(value, bytes) else str(value)


def shutdown() -> None:
    """Disconnect this process from Ray (stops the cluster if we started it)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


# --------------------------------------------------------------- State API


def _state():
    from ray.util import state

    return state


def _to_dict(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    if dataclasses.is_dataclass(item):
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


def _listing(function, *, filters=None, limit: int = STATE_LIMIT, detail: bool = False, timeout: int = 30) -> Listing:
    try:
        items = function(address=_state_address(), filters=filters, limit=limit, detail=detail, timeout=timeout,
                         raise_on_missing_output=False)
    except Exception as error:
        raise ClusterUnreachable(f"Ray's State API did not answer ({type(error).__name__}: {str(error)[:200]})",
                                 fix="the dashboard process serves the State API: check it runs (`ray status`)") from None
    items = [_to_dict(item) for item in items]
    return Listing(items=items, truncated=len(items) >= limit, total=len(items))


def nodes(*, alive_only: bool = False) -> list[dict[str, Any]]:
    """Every node: node_id, node_ip, is_head_node, state, resources_total, labels."""
    import ray

    result = []
    for node in ray.nodes():
        if alive_only and not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        result.append({
            "node_id": node.get("NodeID"),
            "node_ip": node.get("NodeManagerAddress"),
            "hostname": node.get("NodeManagerHostname"),
            "alive": bool(node.get("Alive")),
            "is_head_node": ray_private.HEAD_NODE_RESOURCE in resources,
            "resources_total": {k: v for k, v in resources.items() if not k.startswith("node:")},
            "labels": node.get("Labels", {}),
            "object_store_socket": node.get("ObjectStoreSocketName"),
            "temp_dir": node.get("TempDir") or None,
        })
    return result


def head_node() -> dict[str, Any] | None:
    """The head node, from :func:`nodes`."""
    return next((node for node in nodes() if node["is_head_node"]), None)


def workers(*, alive_only: bool = True, limit: int = STATE_LIMIT) -> Listing:
    """Ray worker processes (drivers included): worker_id, pid, ip, worker_type, is_alive."""
    filters = [("is_alive", "=", "True")] if alive_only else None
    return _listing(_state().list_workers, filters=filters, limit=limit, detail=True)


def actors(*, state: str | None = None, limit: int = STATE_LIMIT, detail: bool = True) -> Listing:
    """Actors: actor_id, class_name, name, state, pid, node_id, death_cause (with detail)."""
    filters = [("state", "=", state)] if state else None
    return _listing(_state().list_actors, filters=filters, limit=limit, detail=detail)


def tasks(*, state: str | None = None, limit: int = STATE_LIMIT, detail: bool = True, filters=None) -> Listing:
    """Tasks and actor calls from the task events (the newest attempt of each)."""
    filters = list(filters or [])
    if state:
        filters.append(("state", "=", state))
    return _listing(_state().list_tasks, filters=filters or None, limit=limit, detail=detail)


def placement_groups(*, limit: int = STATE_LIMIT) -> Listing:
    """Placement groups with their bundles and state."""
    return _listing(_state().list_placement_groups, limit=limit, detail=True)


def objects(*, reference_type: str | None = None, limit: int = STATE_LIMIT) -> Listing:
    """Object references: object_id, task_status, reference_type, pid, ip (who holds the ref)."""
    filters = [("reference_type", "=", reference_type)] if reference_type else None
    return _listing(_state().list_objects, filters=filters, limit=limit, detail=True)


def available_resources() -> dict[str, float]:
    """Resources free right now across the cluster (Ray's own view; not per node)."""
    import ray

    try:
        return {key: value for key, value in ray.available_resources().items() if not key.startswith("node:")}
    except Exception:
        return {}


def get_task(task: Any) -> list[dict[str, Any]]:
    """Every attempt of one task (id string or ObjectRef), oldest attempt first."""
    try:
        found = _state().get_task(task, address=_state_address(), timeout=30)
    except Exception as error:
        raise ClusterUnreachable(f"Ray's State API did not answer ({type(error).__name__}: {str(error)[:200]})",
                                 fix="check the dashboard runs (`ray status`)") from None
    if found is None:
        return []
    items = found if isinstance(found, list) else [found]
    return sorted((_to_dict(item) for item in items), key=lambda item: item.get("attempt_number", 0))


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


def local_logs_dir() -> str | None:
    """This process's Ray session logs folder (on its node), or None when not in a Ray process."""
    try:
        import ray

        node = ray._private.worker._global_node
        return node.get_logs_dir_path() if node is not None else None
    except Exception:
        return None


def dead_workers(*, limit: int = STATE_LIMIT) -> Listing:
    """Worker processes that are gone: worker_id, pid, node_id, exit_type, exit_detail, end_time_ms."""
    return _listing(_state().list_workers, filters=[("is_alive", "=", "False")], limit=limit, detail=True)


def runtime_env_vars(actor: Mapping[str, Any]) -> dict[str, str]:
    """The ``env_vars`` of an actor's creation ``runtime_env`` (State API ``serialized_runtime_env``)."""
    import json

    raw = actor.get("serialized_runtime_env") or actor.get("runtime_env") or {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return {}
    env = raw.get("env_vars") if isinstance(raw, dict) else None
    return {str(key): str(value) for key, value in (env or {}).items()}


def list_log_files(*, node_id: str | None = None, glob_filter: str | None = None,
                   timeout: int = 30) -> dict[str, list[str]]:
    """Ray's log files on a node (default: the head), by category, from the State API."""
    if node_id is None:
        head = head_node()
        node_id = head["node_id"] if head else None
    try:
        return dict(_state().list_logs(address=_state_address(), node_id=node_id, glob_filter=glob_filter,
                                       timeout=timeout))
    except Exception as error:
        raise ClusterUnreachable(f"Ray's State API could not list logs ({type(error).__name__}: {str(error)[:200]})",
                                 fix="check the dashboard runs (`ray status`)") from None


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


# ------------------------------------------------ inside a worker (zero-code setup)
# Private Ray names the worker setup (raysleuth.worker_setup) needs, kept here so a Ray
# upgrade touches one file. Each returns a plain value or False/None when Ray moved.


def current_job_id() -> str | None:
    """The Ray job id of this process (hex), or None outside Ray."""
    try:
        import ray

        return ray.get_runtime_context().get_job_id() if ray.is_initialized() else None
    except Exception:
        return None


def wrap_worker_calls(wrap: Any) -> bool:
    """Route every task function and actor method this worker runs through ``wrap(fn, label)``, once each.

    ``wrap`` gets the user's function (for an actor method: the unbound
    function, ``__init__`` included) and ``Class.method`` / the qualified
    name, and returns a function of the same kind (sync, async, generator);
    it may return ``fn`` itself to leave it alone. Ray's built-in methods
    (``__ray_*``), private methods and class/static methods are never
    offered. Done lazily, when the worker first looks a function up, so it
    costs nothing at start-up and one set lookup per call after. Returns
    False when Ray's function manager is not where we expect it.
    """
    try:
        from ray._private import worker as ray_worker

        manager = ray_worker.global_worker.function_actor_manager
        original = manager.get_execution_info
        if getattr(original, "_raysleuth_wrapped", False):
            return True
        table = manager._function_execution_info
        make_executor = manager._make_actor_method_executor
    except Exception:
        return False
    seen: set = set()

    def get_execution_info(job_id, function_descriptor):
        info = original(job_id, function_descriptor)
        key = function_descriptor.function_id
        if key in seen:
            return info
        seen.add(key)
        try:
            replaced = _wrapped_execution_info(info, wrap, make_executor)
            if replaced is not info:
                table[key] = replaced
                return replaced
        except Exception:
            pass
        return info

    get_execution_info._raysleuth_wrapped = True  # type: ignore[attr-defined]
    manager.get_execution_info = get_execution_info
    return True


def _wrapped_execution_info(info: Any, wrap: Any, make_executor: Any) -> Any:
    import inspect

    function = info.function
    name = getattr(function, "name", None)
    method = getattr(function, "method", None)
    if name is not None and method is not None:  # an actor method's executor
        if name not in ("__init__", "__call__") and name.startswith("_"):
            return info
        if inspect.ismethod(method) or not inspect.isfunction(method):
            return info  # class/static methods: Ray binds them itself
        label = getattr(method, "__qualname__", name)
        wrapped = wrap(method, label)
        return info if wrapped is method else info._replace(function=make_executor(name, wrapped))
    if not inspect.isfunction(function):
        return info
    wrapped = wrap(function, getattr(function, "__qualname__", None) or getattr(function, "__name__", "task"))
    return info if wrapped is function else info._replace(function=wrapped)


def on_ray_train_user_error(callback: Any) -> bool:
    """Call ``callback(exception)`` when a Ray Train (v2) training function raises in this worker.

    Ray Train runs the user's function on its own thread and keeps the
    exception for the controller, so it never escapes a method; this hooks
    the one place that sees it, without changing what Ray Train reports.
    Returns False when Ray Train is not loaded here or has moved.
    """
    module = sys.modules.get("ray.train.v2._internal.execution.worker_group.thread_runner")
    if module is None:
        return False
    original = getattr(module, "construct_user_exception_with_traceback", None)
    if original is None:
        return False
    if getattr(original, "_raysleuth_wrapped", False):
        return True

    def construct_user_exception_with_traceback(error, *args, **kwargs):
        try:
            callback(error)
        except Exception:
            pass
        return original(error, *args, **kwargs)

    construct_user_exception_with_traceback._raysleuth_wrapped = True  # type: ignore[attr-defined]
    module.construct_user_exception_with_traceback = construct_user_exception_with_traceback
    return True


def death_reason(actor: dict[str, Any]) -> tuple[str, bool]:
    """A dead actor's cause in one line, and whether it was ended on purpose (``ray.kill``, its job ended).

    Reads the State API's ``death_cause`` (``actor_died_error_context``:
    ``reason``, ``error_message``) so callers never touch its raw shape.
    """
    cause = actor.get("death_cause") or {}
    context = cause.get("actor_died_error_context") or cause.get("creation_task_failure_context") or {}
    reason = str(context.get("reason") or "")
    message = str(context.get("error_message") or cause.get("error_message") or "").strip()
    first = message.split(". Some common causes", 1)[0].replace("The actor is dead because ", "")
    on_purpose = reason in ("RAY_KILL", "OWNER_DIED", "OUT_OF_SCOPE", "REF_DELETED", "NODE_DIED_INTENDED") or (
        "ray.kill" in message) or "INTENDED_USER_EXIT" in first.split("Worker exit detail")[0]
    text = (f"{reason}: {first}" if reason else first)[:300] or "died (no cause recorded)"
    return text, on_purpose
