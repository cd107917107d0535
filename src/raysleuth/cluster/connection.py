"""Connect to Ray (or start one): address, token authentication, session.

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

from raysleuth.errors import AuthTokenMissing, ClusterUnreachable, UsageError
from raysleuth import ray_private
from raysleuth.cluster.discovery import AddressChoice, choose_address
from raysleuth.native_stderr import filtered_stderr

__all__ = ["ClusterInfo", "cluster_auth_mode", "connect", "find_auth_token", "on_connect", "pin_address",
           "resolve_address", "session_name",
           "shutdown", "start_local", "tcp_problem"]

DEFAULT_NAMESPACE = "raysleuth"


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
    choice: AddressChoice | None = None
    """How the address was chosen, and the other clusters alive on this machine (``None``: started here)."""
    token_mode_switched_here: bool = False
    """True when the cluster wants a token and raysleuth switched this process to token mode itself (the
    user's environment has no ``RAY_AUTH_MODE``): a driver started from this environment would fail."""


_LISTENERS: list = []


def on_connect(listener) -> None:
    """Call ``listener(event)`` when :func:`connect` chose a cluster (an :class:`AddressChoice`, before it
    connects, so a failed connection is still named) and when it connected (the :class:`ClusterInfo`).

    The command line uses it to name the chosen cluster (and the others) in every live command.
    """
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)


def _announce(event):
    for listener in list(_LISTENERS):
        try:
            listener(event)
        except Exception:  # a listener must never break a connection
            pass
    return event


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
    """Turn ``--address`` / ``RAY_ADDRESS`` / ``auto`` into an ip:port, or ``None`` (see :func:`choose`)."""
    return choose(address).address


def choose(address: str | None) -> AddressChoice:
    """The cluster ``address`` (``--address``, else ``RAY_ADDRESS``, else Ray's current one) means, and the others."""
    given = address or os.environ.get("RAY_ADDRESS") or "auto"
    if given.startswith("ray://"):
        raise UsageError(
            f"address {given!r} is a Ray Client address",
            fix="raysleuth needs the GCS address (ip:port, e.g. 10.0.0.1:6379) or 'auto' on a cluster node",
        )
    return choose_address(address)


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


_switched_here = False


def cluster_auth_mode(address: str) -> str:
    """``token`` when the cluster at ``address`` requires token authentication, else ``disabled``.

    An explicit ``RAY_AUTH_MODE`` is taken as it is. Raises :class:`AuthTokenMissing` (with the fix) when the
    cluster wants a token and none is found here, :class:`ClusterUnreachable` when nothing answers. For a
    second driver (``raysleuth run --address``): its environment needs ``RAY_AUTH_MODE=token`` then.
    """
    if os.environ.get("RAY_AUTH_MODE"):
        return os.environ["RAY_AUTH_MODE"].lower()
    problem = tcp_problem(address)
    if problem:
        raise ClusterUnreachable(f"cannot reach the Ray cluster at {address} ({problem})",
                                 fix="check the address (`ray status` on the head node prints it) and that the port "
                                     "is open")
    try:
        with filtered_stderr(_PROBE_NOISE):
            _probe(address, None)
    except AuthTokenMissing:
        if find_auth_token() is None:
            raise
        return "token"
    return "disabled"


def _enable_token_mode() -> None:
    global _switched_here
    _switched_here = True
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
        with filtered_stderr(_UNREACHABLE_NOISE):
            _probe(address, token_source if os.environ["RAY_AUTH_MODE"].lower() == "token" else None)
        return
    try:
        with filtered_stderr(_PROBE_NOISE):  # Ray's C++ auth warnings for our own token-less probe
            _probe(address, None)
    except AuthTokenMissing:
        if token_source is None:
            raise
        _enable_token_mode()
        with filtered_stderr(_UNREACHABLE_NOISE):
            _probe(address, token_source)


#: What Ray's C++ client prints when the token-less probe meets a token cluster (expected, not the user's problem).
_UNREACHABLE_NOISE = re.compile(r"(?:gcs_client\.cc|rpc_client\.h).*Failed to (?:connect to|get cluster ID)")
"""What Ray's C++ client prints while our probe meets a port that is not a GCS: raysleuth's own line says it."""
_PROBE_NOISE = re.compile(r"gcs_client\.cc.*(?:InvalidAuthToken|Unauthenticated)|"
                          r"(?:InvalidAuthToken|Unauthenticated).*(?:gcs|GCS|cluster ID)|"
                          + _UNREACHABLE_NOISE.pattern)


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
    started = time.monotonic()
    loaded = sys.modules.get("ray")  # not imported yet: not connected either (importing it takes ~0.5 s of CPU)
    if loaded is not None and getattr(loaded, "is_initialized", lambda: False)():
        return _info(started_here=False, seconds=time.monotonic() - started)
    wanted = address or os.environ.get("RAY_ADDRESS") or "auto"
    choice = _announce(choose(address))
    resolved = choice.address
    if resolved is None:
        if not start_local:
            raise ClusterUnreachable(
                f"no running Ray cluster found for address {wanted!r}",
                fix="start one (`ray start --head`), pass --address ip:port, or set RAY_ADDRESS",
            )
        return _start_local(num_cpus=num_cpus, namespace=namespace, runtime_env=runtime_env)
    problem = tcp_problem(resolved)
    if problem:  # told before Ray is imported: reading a stored run after its cluster is gone stays quick
        raise ClusterUnreachable(
            f"cannot reach the Ray cluster at {resolved} ({problem})",
            fix="check the address (`ray status` on the head node prints it) and that the port is open",
        )
    import ray

    _authenticate(resolved)
    try:
        ray.init(address=resolved, namespace=namespace, log_to_driver=False,
                 logging_level=logging.ERROR, runtime_env=runtime_env)
    except Exception as error:
        raise ClusterUnreachable(f"ray.init(address={resolved!r}) failed: {str(error).splitlines()[0][:300]}",
                                 fix="check that this machine runs the same Ray and Python versions as the cluster") from None
    info = _info(started_here=False, seconds=time.monotonic() - started)
    info.choice = choice
    return _announce(info)


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


_start_local = start_local  # connect()'s flag of the same name hides the function inside connect()


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
        token_mode_switched_here=_switched_here,
    )


def pin_address() -> str | None:
    """In a process connected to Ray whose ``RAY_ADDRESS`` is ``local``/``auto``: set it to the connected GCS.

    Ray's State API always prefers ``RAY_ADDRESS`` to the address it is given, and resolves ``local``/``auto``
    anew, which fails once several clusters run on the machine (a job started with ``RAY_ADDRESS=local``, and
    its workers, inherit it). Returns the address now in force (``None`` when not connected).
    """
    import ray

    if not ray.is_initialized():
        return None
    current = os.environ.get("RAY_ADDRESS")
    if current in ("local", "auto"):
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    return os.environ.get("RAY_ADDRESS") or ray.get_runtime_context().gcs_address


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
