"""Breakpoints that hit inside Ray workers, and never hang a job forever.

    import raysleuth as rs
    rs.breakpoint_on_rank(1)                       # only rank 1 stops
    rs.conditional_breakpoint(condition=loss > 10, rank_filter=lambda r: r == 0)
    rs.breakpoint(name="after-rollout", rank=[0, 3], when=step % 100 == 0)

**Off unless armed.** A disarmed call is one read of a module-level bool
(:data:`_quiet`), measured by ``bench/bench_breakpoint.py``. Breakpoints are
armed by ``RAYSLEUTH_DEBUG=1`` (alias ``VERL_DEBUG``) or at runtime from
outside: ``raysleuth debug arm [NAME] [--rank R]`` sets the writer control
``debug``; a daemon thread started on the first call polls the controls
every :data:`POLL_INTERVAL` seconds, so running workers pick it up without
a restart (``debug disarm`` turns them off again, env-armed ones included).

**When hit** (armed, rank and condition pass): a debug server starts on
``settings().debug_host`` (127.0.0.1 by default) — debugpy, or pdb over TCP
with ``RAYSLEUTH_DEBUGGER=pdb`` — the session is published (evidence kind
``debug_session`` plus the writer mailbox ``debug_sessions``), and the
worker waits for a client at most ``settings().debug_wait`` seconds
(``RAYSLEUTH_DEBUG_WAIT``, default 600). An unattended breakpoint logs a
warning and lets the worker run on; that location then stays quiet until
breakpoints are armed again, so a breakpoint in a loop cannot stall a job
600 s per step. Other ranks never wait.

Scaling note: each process polls the writer once per POLL_INTERVAL (one
tiny actor call). At thousands of workers, publish the control through a
per-node agent (one poll per node) instead.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
import traceback as traceback_module
import uuid
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

from raysleuth import runtime
from raysleuth.breakpoints._sessions import (
    CONTROL_KEY,
    TOPIC,
    DebugSession,
    attach_instructions,
    latest_states,
    local_addresses,
    merge_launch_json,
    vscode_configuration,
    write_launch_json,
)

__all__ = [
    "ArmState",
    "DebugSession",
    "POLL_INTERVAL",
    "arm",
    "arm_cluster",
    "arm_state",
    "attach_instructions",
    "breakpoint",
    "breakpoint_on_rank",
    "conditional_breakpoint",
    "disarm",
    "disarm_cluster",
    "find_session",
    "list_sessions",
    "local_addresses",
    "merge_launch_json",
    "post_mortem_session",
    "reset_cluster",
    "vscode_configuration",
    "write_launch_json",
]

log = logging.getLogger("raysleuth.breakpoints")

#: Seconds between two polls of the writer's controls (runtime arming).
POLL_INTERVAL = 2.0

# ------------------------------------------------------------------ arming
# The hot path reads only ``_quiet``: True when disarmed and the arming poll
# is already running. Everything else lives on the slow path.
_quiet = False
_armed = False
_arm_names: frozenset[str] | None = None
_arm_ranks: frozenset[int] | None = None
_arm_epoch: Any = None
_initialised_pid: int | None = None
_poller: threading.Thread | None = None
_state_lock = threading.RLock()
_session_lock = threading.Lock()
_skipped: set[tuple[str, int, str | None]] = set()
_warned: set[str] = set()
_counter = itertools.count(1)


class ArmState:
    """Whether breakpoints are armed in this process, and for what."""

    def __init__(self, armed: bool, names: frozenset[str] | None, ranks: frozenset[int] | None, source: str) -> None:
        self.armed = armed
        self.names = sorted(names) if names is not None else None
        self.ranks = sorted(ranks) if ranks is not None else None
        self.source = source

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"armed": self.armed, "names": self.names, "ranks": self.ranks, "source": self.source}


_arm_source = "env"


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def _set(armed: bool, names: Iterable[str] | None, ranks: Iterable[int] | None, source: str, epoch: Any = None) -> None:
    global _armed, _arm_names, _arm_ranks, _quiet, _arm_epoch, _arm_source
    with _state_lock:
        if armed and (not _armed or epoch != _arm_epoch):
            _skipped.clear()  # armed again: unattended locations may stop again
        _armed = bool(armed)
        _arm_names = frozenset(names) if names else None
        _arm_ranks = frozenset(int(r) for r in ranks) if ranks is not None and ranks != [] else None
        _arm_epoch = epoch
        _arm_source = source
        _quiet = (not _armed) and _poller is not None


def _initialise() -> None:
    """First call in this process: read the settings and follow the writer's ``debug`` control.

    Arming is polled by the worker's one control thread (:mod:`raysleuth.control`).
    """
    global _initialised_pid, _poller, _quiet
    with _state_lock:
        if _initialised_pid == os.getpid():
            return
        _initialised_pid = os.getpid()
        _set(runtime.settings().debug, None, None, "env")
        from raysleuth import control

        control.register(CONTROL_KEY, apply_control)
        _poller = control.thread()
        _quiet = not _armed


def apply_control(value: Any) -> None:
    """Apply the writer's ``debug`` control (``None``: back to the environment's setting)."""
    if not isinstance(value, dict):
        _set(runtime.settings().debug, None, None, "env")
        return
    _set(bool(value.get("armed")), value.get("names"), value.get("ranks"), "control", value.get("since"))


def arm(name: str | Iterable[str] | None = None, ranks: int | Iterable[int] | None = None) -> None:
    """Arm breakpoints in this process (only ``name``d ones / on ``ranks`` when given)."""
    _initialise()
    names = [name] if isinstance(name, str) else (list(name) if name else None)
    rank_list = [ranks] if isinstance(ranks, int) else (list(ranks) if ranks is not None else None)
    _set(True, names, rank_list, "arm()", time.time())


def disarm() -> None:
    """Disarm breakpoints in this process (until armed again, locally or by the CLI)."""
    _initialise()
    _set(False, None, None, "disarm()")


def arm_state() -> ArmState:
    """This process's arming, and where it came from (env, control, arm())."""
    _initialise()
    return ArmState(_armed, _arm_names, _arm_ranks, _arm_source)


def _set_control(value: Any, timeout: float) -> None:
    """Post the arming ``value`` to the writer; a writer that does not answer is a clear error, not a traceback."""
    from raysleuth.recorder import get_writer
    import ray

    try:
        ray.get(get_writer().set_control.remote(CONTROL_KEY, value), timeout=timeout)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as error:
        from raysleuth.errors import CaptureTimeout

        raise CaptureTimeout(f"the evidence writer did not take the breakpoint arming within {timeout:g}s "
                             f"({type(error).__name__})",
                             fix="check `raysleuth doctor`; retry when the writer answers") from None


def arm_cluster(name: str | None = None, ranks: Iterable[int] | None = None, *,
                timeout: float = 30.0) -> dict[str, Any]:
    """Arm breakpoints in every worker of the connected cluster (picked up within POLL_INTERVAL s)."""
    value = {"armed": True, "names": [name] if name else None,
             "ranks": sorted(int(r) for r in ranks) if ranks else None, "since": time.time()}
    _set_control(value, timeout)
    return value


def disarm_cluster(*, timeout: float = 30.0) -> dict[str, Any]:
    """Disarm breakpoints in every worker, including workers armed by RAYSLEUTH_DEBUG=1."""
    value = {"armed": False, "since": time.time()}
    _set_control(value, timeout)
    return value


def reset_cluster(*, timeout: float = 30.0) -> None:
    """Forget runtime arming: every worker follows its own RAYSLEUTH_DEBUG again."""
    _set_control(None, timeout)


# -------------------------------------------------------------- public API


def breakpoint(name: str | None = None, rank: int | Iterable[int] | None = None,
               when: bool | Callable[[], bool] = True) -> None:
    """Stop here in a debugger, if breakpoints are armed, the rank matches and ``when`` holds.

    ``rank``: a rank or ranks that stop (``None``: every rank). ``when``: a
    bool or a callable evaluated only when armed. Disarmed, this costs one
    bool check. Never raises; other ranks run on; waits at most
    ``RAYSLEUTH_DEBUG_WAIT`` seconds for a client.
    """
    if _quiet:
        return None
    _consider(sys._getframe(1), name, rank, when)
    return None


def breakpoint_on_rank(rank: int | Iterable[int], name: str | None = None) -> None:
    """A breakpoint that only ``rank`` (or ranks) stop at; the others run on."""
    if _quiet:
        return None
    _consider(sys._getframe(1), name, rank, True)
    return None


def conditional_breakpoint(condition: bool | Callable[[], bool] = True,
                           rank_filter: int | Iterable[int] | Callable[[int | None], bool] | None = None,
                           name: str | None = None) -> None:
    """Stop where ``condition`` holds and the rank passes ``rank_filter`` (a callable, rank or ranks)."""
    if _quiet:
        return None
    _consider(sys._getframe(1), name, rank_filter, condition)
    return None


def _rank_matches(rank: int | None, wanted: Any) -> bool:
    if wanted is None:
        return True
    if callable(wanted):
        return bool(wanted(rank))
    if rank is None:
        return False
    if isinstance(wanted, int):
        return rank == wanted
    return rank in set(wanted)


def _consider(frame: FrameType, name: str | None, rank_filter: Any, when: Any) -> None:
    """The slow path: arming, filters, condition, then a session. Never raises."""
    try:
        if _initialised_pid != os.getpid():
            _initialise()
        if not _armed:
            return
        if _arm_names is not None and name not in _arm_names:
            return
        rank = runtime.get_rank()
        if _arm_ranks is not None and rank not in _arm_ranks:
            return
        if not _rank_matches(rank, rank_filter):
            return
        if callable(when):
            when = when()
        if not when:
            return
        key = (frame.f_code.co_filename, frame.f_lineno, name)
        if key in _skipped:
            return
    except Exception as error:  # a bad condition or filter must not take the step down
        _warn_once(f"condition:{error!r}", "raysleuth: breakpoint %s skipped: %r", name, error)
        return
    _open_session(frame, name, key=key)


def post_mortem_session(traceback_or_frame: Any, name: str = "post-mortem") -> DebugSession | None:
    """Open a debug session at a crash: a traceback, an exception, or a frame.

    With a traceback or exception the client sees the exception and the
    frames of its traceback; with a frame, the session stops there. Obeys
    the same wait limit as breakpoints, ignores arming (the caller decides,
    e.g. ``RAYSLEUTH_POST_MORTEM=1``) and never raises. Returns the session
    (its final state) or ``None`` when none could be opened.
    """
    try:
        exc_info = None
        frame = None
        if isinstance(traceback_or_frame, BaseException):
            error = traceback_or_frame
            exc_info = (type(error), error, error.__traceback__)
        elif isinstance(traceback_or_frame, TracebackType):
            current = sys.exc_info()
            error = current[1] if current[2] is traceback_or_frame else None
            if error is None:
                error = RuntimeError("post-mortem (exception not available)")
            exc_info = (type(error), error, traceback_or_frame)
        elif isinstance(traceback_or_frame, FrameType):
            frame = traceback_or_frame
        elif traceback_or_frame is None and sys.exc_info()[1] is not None:
            exc_info = sys.exc_info()
        else:
            frame = sys._getframe(1)
        if exc_info is not None and exc_info[2] is not None:
            last = exc_info[2]
            while last.tb_next is not None:
                last = last.tb_next
            frame = last.tb_frame
        return _open_session(frame, name, exc_info=exc_info)
    except Exception as error:
        _warn_once("post-mortem", "raysleuth: post-mortem session failed: %r", error)
        return None


# ---------------------------------------------------------------- sessions


def _new_session(kind: str, host: str, port: int, frame: FrameType | None, name: str | None,
                 exception: str | None) -> DebugSession:
    me = runtime.whoami()
    started = time.time()
    return DebugSession(
        id=f"{uuid.uuid4().hex[:6]}{next(_counter)}",
        kind=kind, state="waiting", host=host, port=port, name=name, rank=me.rank, pid=me.pid,
        node_id=me.node_id, node_ip=me.node_ip, hostname=me.hostname, actor_name=me.actor_name,
        actor_class=me.actor_class,
        file=frame.f_code.co_filename if frame is not None else None,
        line=frame.f_lineno if frame is not None else None,
        function=frame.f_code.co_name if frame is not None else None,
        since=started, updated=started, exception=exception,
    )


def _publish(session: DebugSession) -> None:
    """Record the session's state as evidence and in the writer's mailbox. Never raises."""
    session.updated = time.time()
    data = session.to_dict()
    level = "WARNING" if session.reason and "no client" in session.reason else "INFO"
    try:
        from raysleuth.recorder import get_client, record

        record("debug_session", data, name=session.name, level=level)
        get_client().flush(timeout=5)
    except Exception:
        pass
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            from raysleuth.recorder import get_writer

            ray.get(get_writer(create=False).post.remote(TOPIC, session.id, data), timeout=5)
    except Exception:
        pass
    if session.state == "waiting":
        log.warning("raysleuth: %s session %s waiting for a client on %s:%s (rank %s, %s), at most %gs",
                    session.kind, session.id, session.host, session.port, session.rank, session.location,
                    runtime.settings().debug_wait)
    elif session.state == "released" and session.reason and "no client" in session.reason:
        log.warning("raysleuth: breakpoint %s at %s: %s; the worker runs on", session.name or "",
                    session.location, session.reason)


def _open_session(frame: FrameType | None, name: str | None, *, key: tuple | None = None,
                  exc_info: tuple | None = None) -> DebugSession | None:
    """Start (or reuse) a server, publish, wait (bounded), stop at ``frame``. Never raises.

    Nothing may run after the pdb ``set_trace`` call: the next traced line
    must be the caller's.
    """
    from raysleuth.breakpoints import _servers

    settings = runtime.settings()
    wait = max(0.0, float(settings.debug_wait))
    host = settings.debug_host or "127.0.0.1"
    if host not in ("127.0.0.1", "localhost", "::1"):
        _warn_once(f"host:{host}", "raysleuth: debug servers listen on %s (RAYSLEUTH_DEBUG_HOST): anyone who "
                   "reaches this address can run code in this worker", host)
    kind = settings.debugger
    if kind == "debugpy" and not _servers.debugpy_available():
        _warn_once("no-debugpy", "raysleuth: debugpy is not installed here; using the pdb server")
        kind = "pdb"
    if not _session_lock.acquire(timeout=wait if wait > 0 else 0.001):
        _warn_once("busy", "raysleuth: another breakpoint of this process holds the debugger; skipped")
        return None
    try:
        exception = _servers.describe_exception(exc_info)
        if kind == "debugpy":
            try:
                listen_host, port = _servers.debugpy_endpoint(host)
            except Exception as error:
                _warn_once("debugpy-listen", "raysleuth: cannot start debugpy (%s); using the pdb server", error)
                kind = "pdb"
        if kind == "debugpy":
            session = _new_session("debugpy", listen_host, port, frame, name, exception)
            attached = _servers.debugpy_session(session, frame, wait, _publish, exc_info=exc_info)
        else:
            session = _new_session("pdb", host, 0, frame, name, exception)
            attached = _servers.pdb_session(session, frame, wait, host, _publish, exc_info=exc_info)
        if not attached and key is not None:
            _skipped.add(key)
        return session
    except Exception as error:
        _warn_once(f"session:{type(error).__name__}", "raysleuth: breakpoint %s could not open a debug session: %s",
                   name or "", "".join(traceback_module.format_exception_only(type(error), error)).strip())
        return None
    finally:
        _session_lock.release()


# ----------------------------------------------------------------- listing


def list_sessions(*, run: str | None = None, home: Any = None, include_released: bool = False,
                  live: bool | None = None) -> list[DebugSession]:
    """Debug sessions: live from the writer's mailbox when connected, else from the evidence store.

    ``live=True`` requires the writer; ``live=False`` reads only the store.
    Released sessions are left out unless ``include_released``.
    """
    rows: list[dict[str, Any]] = []
    ray = sys.modules.get("ray")
    connected = ray is not None and ray.is_initialized()
    if live is not False and connected:
        from raysleuth.recorder import get_writer

        try:
            rows = list(ray.get(get_writer(create=False).read.remote(TOPIC), timeout=30).values())
        except ValueError:
            rows = []  # no writer yet: nothing recorded
    else:
        from raysleuth.recorder import open_store

        store = open_store(run, home=home)
        try:
            rows = [record.data for record in store.query("debug_session")]
        finally:
            store.close()
    sessions = latest_states(rows)
    if not include_released:
        sessions = [session for session in sessions if session.state != "released"]
    return sessions


def find_session(session_id: str, sessions: list[DebugSession]) -> DebugSession:
    """The session whose id is (or starts with) ``session_id``; raises ``WorkerNotFound``/``UsageError``."""
    from raysleuth.errors import UsageError, WorkerNotFound

    matches = [session for session in sessions if session.id == session_id]
    if not matches:
        matches = [session for session in sessions if session.id.startswith(session_id)]
    if not matches:
        known = ", ".join(session.id for session in sessions) or "none"
        raise WorkerNotFound(f"no debug session {session_id!r} (live sessions: {known})",
                             fix="list them with `raysleuth debug ls --all`")
    if len(matches) > 1:
        raise UsageError(f"{session_id!r} matches {len(matches)} sessions", fix="give more of the id")
    return matches[0]
