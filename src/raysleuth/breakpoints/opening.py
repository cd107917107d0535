"""Opening a debug session: a breakpoint that was hit, or a crash (post-mortem).

A debug server starts on ``settings().debug_host`` (debugpy, or pdb over
TCP), the session is published (evidence kind ``debug_session`` and the
writer mailbox ``debug_sessions``), and the worker waits for a client at
most ``settings().debug_wait`` seconds. Nothing here raises into the
caller's step.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
import traceback as traceback_module
import uuid
from types import FrameType, TracebackType
from typing import Any

from raysleuth import runtime
from raysleuth.breakpoints import _servers
from raysleuth.breakpoints._sessions import TOPIC, DebugSession

__all__ = ["post_mortem_session"]

log = logging.getLogger("raysleuth.breakpoints")

_session_lock = threading.Lock()
_warned: set[str] = set()
_counter = itertools.count(1)


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def post_mortem_session(traceback_or_frame: Any, name: str = "post-mortem") -> DebugSession | None:
    """Open a debug session at a crash: a traceback, an exception, or a frame.

    With a traceback or exception the client sees the exception and the
    frames of its traceback; with a frame, the session stops there. Obeys
    the same wait limit as breakpoints, ignores arming (the caller decides,
    e.g. ``RAYSLEUTH_POST_MORTEM=1``) and never raises. Returns the session
    (its final state) or ``None`` when none could be opened.
    """
    try:
        exc_info: tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None] | None = None
        error: BaseException | None
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
        # lazy: rs.breakpoint stays light to import: this loads when a session opens
        from raysleuth.recorder import get_client, record

        record("debug_session", data, name=session.name, level=level)
        get_client().flush(timeout=5)
    except Exception:
        pass
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            # lazy: rs.breakpoint stays light to import: this loads when a session opens
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
                  exc_info: tuple | None = None, skipped: set | None = None,
                  cancelled: Any = None) -> DebugSession | None:
    """Start (or reuse) a server, publish, wait (bounded), stop at ``frame``. Never raises.

    A session no client attached to adds ``key`` to ``skipped`` (the arming's
    quiet locations). ``cancelled()`` true while waiting (breakpoints were
    disarmed) releases the session at once.

    Nothing may run after the pdb ``set_trace`` call: the next traced line
    must be the caller's.
    """

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
            attached = _servers.debugpy_session(session, frame, wait, _publish, exc_info=exc_info,
                                                cancelled=cancelled)
        else:
            session = _new_session("pdb", host, 0, frame, name, exception)
            attached = _servers.pdb_session(session, frame, wait, host, _publish, exc_info=exc_info,
                                            cancelled=cancelled)
        if not attached and key is not None and skipped is not None:
            skipped.add(key)
        return session
    except Exception as error:
        _warn_once(f"session:{type(error).__name__}", "raysleuth: breakpoint %s could not open a debug session: %s",
                   name or "", "".join(traceback_module.format_exception_only(type(error), error)).strip())
        return None
    finally:
        _session_lock.release()
