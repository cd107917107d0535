"""The two debug servers a hit breakpoint can open, both bounded in time.

- **debugpy** (default): ``debugpy.listen((host, 0))`` once per process
  (debugpy refuses a second call; later breakpoints reuse the endpoint),
  then poll ``debugpy.is_client_connected()`` until a DAP client has
  attached (VS Code sends ``initialize``, ``attach``, ``configurationDone``)
  or the wait limit passes. Attached: stop at the caller's frame the way
  ``debugpy.breakpoint()`` does, but at the frame we name.
- **pdb** (:mod:`raysleuth.breakpoints._pdb_server`): a listening socket
  on ``host:0``; the first connection that sends the session's secret gets
  a pdb stopped at the caller's frame.

Both publish the session through a ``publish(session)`` callback and never
raise: a server that cannot start is reported once and the step goes on.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import Any, Callable

from raysleuth.breakpoints._pdb_server import DISARMED, SocketPdb, pdb_session
from raysleuth.breakpoints._sessions import DebugSession, now
from raysleuth.ray_private import global_worker

log = logging.getLogger("raysleuth.breakpoints")

POLL_SECONDS = 0.05

_debugpy_lock = threading.Lock()
_debugpy_endpoint: tuple[str, int] | None = None
_debugpy_error: str | None = None


def _quiet_pydevd() -> None:
    """Skip pydevd's 4-line "frozen modules" warning, printed by every worker that starts debugpy.

    It only says breakpoints inside frozen stdlib modules may be missed; the
    user's own ``PYDEVD_DISABLE_FILE_VALIDATION`` wins. Set before the import
    so debugpy's adapter process inherits it too.
    """
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


def debugpy_available() -> bool:
    """debugpy can be imported here."""
    try:
        import debugpy  # noqa: F401
    except Exception:
        return False
    return True


def debugpy_endpoint(host: str) -> tuple[str, int]:
    """The (host, port) debugpy listens on in this process, started on first use.

    ``debugpy.listen`` may run once per process: the endpoint is cached. If
    someone else (Ray's own debugger) already called it, Ray's port is used.
    Raises ``RuntimeError`` with the reason when no endpoint can be had.
    """
    global _debugpy_endpoint, _debugpy_error
    with _debugpy_lock:
        if _debugpy_endpoint is not None:
            return _debugpy_endpoint
        if _debugpy_error is not None:
            raise RuntimeError(_debugpy_error)
        _quiet_pydevd()
        import debugpy

        hook = sys.breakpointhook  # debugpy takes over breakpoint(); keep the user's hook
        try:
            endpoint = debugpy.listen((host, 0))
        except RuntimeError as error:
            endpoint = _ray_debugger_endpoint()
            if endpoint is None:
                _debugpy_error = f"debugpy.listen failed: {error}"
                raise RuntimeError(_debugpy_error) from None
        except Exception as error:
            _debugpy_error = f"debugpy.listen(({host!r}, 0)) failed: {type(error).__name__}: {error}"
            raise RuntimeError(_debugpy_error) from None
        finally:
            sys.breakpointhook = hook
        _debugpy_endpoint = (str(endpoint[0]), int(endpoint[1]))
        return _debugpy_endpoint


def _ray_debugger_endpoint() -> tuple[str, int] | None:
    ray = sys.modules.get("ray")
    try:
        worker = global_worker() if ray is not None else None
        if worker is None:
            return None
        port = worker.debugger_port
        if port:
            return worker.node_ip_address, int(port)
    except Exception:
        pass
    return None




def _wait(connected: Callable[[], bool], deadline: float, cancelled: Callable[[], bool] | None = None) -> bool | None:
    """True once connected; False at the deadline; None when ``cancelled()`` (disarmed)."""
    while True:
        if connected():
            return True
        if cancelled is not None and cancelled():
            return None
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)


def debugpy_session(session: DebugSession, frame: FrameType | None, wait: float,
                    publish: Callable[[DebugSession], None],
                    exc_info: tuple[Any, BaseException, TracebackType] | None = None,
                    cancelled: Callable[[], bool] | None = None) -> bool:
    """Wait (bounded, or until ``cancelled()``) for a DAP client on the process's debugpy endpoint, then stop.

    Returns True when a client attached and the stop was requested.
    """
    import debugpy

    if not debugpy.is_client_connected():
        session.state = "waiting"
        publish(session)
        attached = _wait(debugpy.is_client_connected, time.monotonic() + wait, cancelled)
        if not attached:
            session.state = "released"
            session.reason = DISARMED if attached is None else f"no client attached within {wait:g}s"
            publish(session)
            return False
    session.state = "attached"
    publish(session)
    _watch_debugpy(session, publish)
    if exc_info is not None:
        _debugpy_stop_on_exception(exc_info)
    else:
        _debugpy_stop_at(frame)
    return True


def _watch_debugpy(session: DebugSession, publish: Callable[[DebugSession], None]) -> None:
    """Mark the session released once the client detaches (a daemon thread)."""
    import debugpy

    def watch() -> None:
        try:
            while debugpy.is_client_connected():
                time.sleep(0.5)
            released = DebugSession.from_dict(session.to_dict())
            released.state, released.reason = "released", "client detached"
            publish(released)
        except Exception:
            pass

    threading.Thread(target=watch, name="raysleuth-debug-watch", daemon=True).start()


def _debugpy_stop_at(frame: FrameType | None) -> None:
    """What ``debugpy.breakpoint()`` does, at ``frame`` instead of our caller."""
    try:
        from debugpy.server import api

        api._settrace(suspend=True, trace_only_current_thread=True, patch_multiprocessing=False,
                      stop_at_frame=frame)
    except Exception:
        import debugpy

        debugpy.breakpoint()


def _debugpy_stop_on_exception(exc_info: tuple[Any, BaseException, TracebackType]) -> None:
    """Show an unhandled exception in the attached client (as Ray's post-mortem does)."""
    import pydevd

    py_db = pydevd.get_global_debugger()
    thread = threading.current_thread()
    info = py_db.set_additional_thread_info(thread)
    info.is_tracing += 1
    try:
        py_db.stop_on_unhandled_exception(py_db, thread, info, exc_info)
    finally:
        info.is_tracing -= 1


def describe_exception(exc_info: tuple[Any, BaseException, TracebackType] | None) -> str | None:
    """``Type: message`` of an exception, for the session record."""
    if exc_info is None or exc_info[1] is None:
        return None
    return f"{type(exc_info[1]).__name__}: {exc_info[1]}"[:500]


__all__ = ["DISARMED", "SocketPdb", "debugpy_available", "debugpy_endpoint", "debugpy_session", "describe_exception",
           "pdb_session", "now"]
