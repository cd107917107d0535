"""The two debug servers a hit breakpoint can open, both bounded in time.

- **debugpy** (default): ``debugpy.listen((host, 0))`` once per process
  (debugpy refuses a second call; later breakpoints reuse the endpoint),
  then poll ``debugpy.is_client_connected()`` until a DAP client has
  attached (VS Code sends ``initialize``, ``attach``, ``configurationDone``)
  or the wait limit passes. Attached: stop at the caller's frame the way
  ``debugpy.breakpoint()`` does, but at the frame we name.
- **pdb**: a listening socket on ``host:0``; the first connection gets a
  :class:`SocketPdb` whose stdin/stdout are the socket, stopped at the
  caller's frame. ``c``/``q``/EOF all release the worker (``q`` never
  raises ``BdbQuit`` into the user's code).

Both publish the session through a ``publish(session)`` callback and never
raise: a server that cannot start is reported once and the step goes on.
"""

from __future__ import annotations

import logging
import os
import pdb
import socket
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import Any, Callable

from raysleuth.breakpoints._sessions import DebugSession, now

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
        from raysleuth.ray_private import global_worker

        worker = global_worker() if ray is not None else None
        port = worker.debugger_port
        if port:
            return worker.node_ip_address, int(port)
    except Exception:
        pass
    return None


def _wait(connected: Callable[[], bool], deadline: float) -> bool:
    while True:
        if connected():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)


def debugpy_session(session: DebugSession, frame: FrameType | None, wait: float,
                    publish: Callable[[DebugSession], None],
                    exc_info: tuple[Any, BaseException, TracebackType] | None = None) -> bool:
    """Wait (bounded) for a DAP client on the process's debugpy endpoint, then stop.

    Returns True when a client attached and the stop was requested.
    """
    import debugpy

    if not debugpy.is_client_connected():
        session.state = "waiting"
        publish(session)
        if not _wait(debugpy.is_client_connected, time.monotonic() + wait):
            session.state, session.reason = "released", f"no client attached within {wait:g}s"
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


# ------------------------------------------------------------------- pdb


class _SocketIO:
    """A text stream over a socket that flushes every write (pdb's stdin/stdout)."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        # Separate reader and writer: a text stream opened "rw" drops its
        # read-ahead on every write, losing commands the client sent together.
        self._reader = connection.makefile("r", encoding="utf-8", errors="replace", newline="\n")
        self._writer = connection.makefile("w", encoding="utf-8", errors="replace", newline="\n")

    def readline(self) -> str:
        try:
            return self._reader.readline()
        except (OSError, ValueError):
            return ""

    def write(self, text: str) -> int:
        try:
            self._writer.write(text)
            self._writer.flush()
        except (OSError, ValueError):
            pass
        return len(text)

    def flush(self) -> None:
        try:
            self._writer.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        for close in (self._reader.close, self._writer.close, self.connection.close):
            try:
                close()
            except OSError:
                pass

    @property
    def encoding(self) -> str:
        return "utf-8"


class SocketPdb(pdb.Pdb):
    """pdb over a socket: ``c``, ``q`` and a closed connection all let the worker run on."""

    def __init__(self, stream: _SocketIO, on_release: Callable[[str], None]) -> None:
        super().__init__(stdin=stream, stdout=stream, nosigint=True, readrc=False,
                         skip=["raysleuth.breakpoints", "raysleuth.breakpoints.*"])
        self.stream = stream
        self.prompt = "(rs-pdb) "
        self._on_release = on_release
        self._released = False

    def _release(self, reason: str) -> None:
        if self._released:
            return
        self._released = True
        try:
            self._on_release(reason)
        finally:
            self.stream.close()

    def do_continue(self, arg: str):  # noqa: D401 - pdb command
        """c(ont(inue)): continue the worker and close this session."""
        self.set_continue()
        self.message("raysleuth: worker continues; session closed")
        self._release("continued")
        return 1

    do_c = do_cont = do_continue

    def do_quit(self, arg: str):
        """q(uit): detach and let the worker run on (never kills the job)."""
        return self._detach("quit")

    do_q = do_exit = do_quit

    def do_EOF(self, arg: str):
        """The client went away: let the worker run on."""
        return self._detach("client disconnected")

    def _detach(self, reason: str):
        self.clear_all_breaks()
        self.set_continue()
        self._release(reason)
        return 1


def pdb_session(session: DebugSession, frame: FrameType | None, wait: float, host: str,
                publish: Callable[[DebugSession], None],
                exc_info: tuple[Any, BaseException, TracebackType] | None = None,
                on_listen: Callable[[int], None] | None = None) -> bool:
    """Listen on ``host:0``, wait (bounded) for one client, then hand it a pdb at ``frame``.

    For ``exc_info`` (post-mortem) the pdb runs here, on the traceback, until
    the client continues. Returns True when a client attached.
    """
    server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, 0))
        server.listen(1)
        session.host, session.port = host, server.getsockname()[1]
        session.state = "waiting"
        publish(session)
        deadline = time.monotonic() + wait
        connection = None
        while connection is None:
            left = deadline - time.monotonic()
            if left <= 0:
                session.state, session.reason = "released", f"no client attached within {wait:g}s"
                publish(session)
                return False
            server.settimeout(min(left, 1.0))
            try:
                connection, _address = server.accept()
            except socket.timeout:
                continue
    finally:
        server.close()
    connection.settimeout(None)
    stream = _SocketIO(connection)
    session.state = "attached"
    publish(session)

    def released(reason: str) -> None:
        done = DebugSession.from_dict(session.to_dict())
        done.state, done.reason = "released", reason
        publish(done)

    debugger = SocketPdb(stream, released)
    who = f"rank {session.rank}" if session.rank is not None else f"pid {session.pid}"
    stream.write(f"raysleuth: {session.name or 'breakpoint'} on {who} at {session.location} "
                 f"(session {session.id}); 'c' continues the worker\n")
    if exc_info is not None:
        stream.write("".join(__import__("traceback").format_exception(*exc_info)))
        try:
            debugger.reset()
            debugger.interaction(None, exc_info[2])
        except Exception as error:  # the client's problem must not become the job's
            log.warning("raysleuth: post-mortem pdb session ended with %r", error)
        finally:
            debugger._release("post-mortem session ended")
        return True
    # Last call before returning: the next traced line is the caller's.
    debugger.set_trace(frame)
    return True


def describe_exception(exc_info: tuple[Any, BaseException, TracebackType] | None) -> str | None:
    """``Type: message`` of an exception, for the session record."""
    if exc_info is None or exc_info[1] is None:
        return None
    return f"{type(exc_info[1]).__name__}: {exc_info[1]}"[:500]


__all__ = ["SocketPdb", "debugpy_available", "debugpy_endpoint", "debugpy_session", "describe_exception",
           "pdb_session", "now"]
