"""The pdb-over-TCP server a hit breakpoint can open, bounded in time and closed to strangers.

A listening socket on ``host:0``. Each session has a secret, kept in a 0600
file (``$RAYSLEUTH_HOME/debug/<session id>.secret``, on the worker's node)
that ``raysleuth debug attach`` reads and sends as its first line. A client
that sends no secret, or a wrong one, within :data:`AUTH_TIMEOUT_S` is
disconnected without a byte of output; the server keeps waiting for the
right one until the wait limit. The first client with the secret gets a
:class:`SocketPdb` whose stdin/stdout are the socket, stopped at the
caller's frame. ``c``/``q``/EOF all release the worker (``q`` never raises
``BdbQuit`` into the user's code). The secret file is removed when the
session stops waiting.
"""

from __future__ import annotations

import hmac
import logging
import pdb
import secrets
import socket
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Callable, cast

from raysleuth import runtime
from raysleuth.breakpoints._sessions import DebugSession

__all__ = ["AUTH_TIMEOUT_S", "DISARMED", "SocketPdb", "pdb_session"]

log = logging.getLogger("raysleuth.breakpoints")

#: Why a waiting breakpoint was released by ``raysleuth debug disarm``.
DISARMED = "disarmed while waiting (raysleuth debug disarm)"
#: How long a connected pdb client has to send the session's secret (seconds).
AUTH_TIMEOUT_S = 5.0


class _SocketIO:
    """A text stream over a socket that flushes every write (pdb's stdin/stdout)."""

    def __init__(self, connection: socket.socket, early: bytes = b"") -> None:
        self.connection = connection
        self._early = early.decode("utf-8", errors="replace")  # sent along with the secret
        # Separate reader and writer: a text stream opened "rw" drops its
        # read-ahead on every write, losing commands the client sent together.
        self._reader = connection.makefile("r", encoding="utf-8", errors="replace", newline="\n")
        self._writer = connection.makefile("w", encoding="utf-8", errors="replace", newline="\n")

    def readline(self) -> str:
        if self._early:
            line, newline, self._early = self._early.partition("\n")
            if newline:
                return line + newline
            self._early = line
        try:
            if self._early:
                early, self._early = self._early, ""
                return early + self._reader.readline()
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
        text_stream = cast(IO[str], stream)  # duck-typed: pdb calls only readline, write and flush
        super().__init__(stdin=text_stream, stdout=text_stream, nosigint=True, readrc=False,
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


def _secret_file(session: DebugSession) -> tuple[Path, str]:
    """A new secret for ``session``, in a 0600 file under ``$RAYSLEUTH_HOME/debug/``."""
    # lazy: rs.breakpoint stays light to import: this loads when a session opens
    from raysleuth.recorder.files import write_private

    secret = secrets.token_urlsafe(32)
    path = Path(runtime.settings().home) / "debug" / f"{session.id}.secret"
    write_private(path, (secret + "\n").encode())
    session.secret_file = str(path)
    return path, secret


def _authenticated(connection: socket.socket, secret: str) -> bytes | None:
    """The client's first line is the secret (within AUTH_TIMEOUT_S): what it sent after it; else None.

    Nothing is sent to a client before it gave the secret.
    """
    connection.settimeout(AUTH_TIMEOUT_S)
    received = b""
    try:
        while b"\n" not in received and len(received) < 256:
            chunk = connection.recv(256)
            if not chunk:
                return None
            received += chunk
    except OSError:
        return None
    line, _, rest = received.partition(b"\n")
    return rest if hmac.compare_digest(line.strip(), secret.encode()) else None


def _accept(server: socket.socket, session: DebugSession, wait: float, secret: str,
            cancelled: Callable[[], bool] | None) -> tuple[socket.socket, bytes] | str:
    """The first client that sends the secret (and what it sent after it), or why none came (a reason)."""
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        if cancelled is not None and cancelled():
            return DISARMED
        if left <= 0:
            return f"no client attached within {wait:g}s"
        server.settimeout(min(left, 1.0))
        try:
            connection, address = server.accept()
        except socket.timeout:
            continue
        early = _authenticated(connection, secret)
        if early is not None:
            return connection, early
        log.warning("raysleuth: a client from %s offered no valid secret for pdb session %s; disconnected",
                    address, session.id)
        connection.close()


def pdb_session(session: DebugSession, frame: FrameType | None, wait: float, host: str,
                publish: Callable[[DebugSession], None],
                exc_info: tuple[Any, BaseException, TracebackType] | None = None,
                on_listen: Callable[[int], None] | None = None,
                cancelled: Callable[[], bool] | None = None) -> bool:
    """Listen on ``host:0``, wait (bounded) for one client that sends the secret, then hand it a pdb at ``frame``.

    For ``exc_info`` (post-mortem) the pdb runs here, on the traceback, until
    the client continues. Returns True when a client attached.
    """
    server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    secret_path, secret = _secret_file(session)
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, 0))
        server.listen(1)
        session.host, session.port = host, server.getsockname()[1]
        session.state = "waiting"
        publish(session)
        accepted = _accept(server, session, wait, secret, cancelled)
        if isinstance(accepted, str):
            session.state, session.reason = "released", accepted
            publish(session)
            return False
        connection, early = accepted
    finally:
        server.close()
        secret_path.unlink(missing_ok=True)  # one client per session: the secret is spent
    connection.settimeout(None)
    stream = _SocketIO(connection, early)
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
