"""Listing debug sessions: live from the writer's mailbox, else from the evidence store."""

from __future__ import annotations

import sys
from typing import Any

from raysleuth import evidence
from raysleuth.breakpoints._sessions import TOPIC, DebugSession, latest_states
from raysleuth.errors import UsageError, WorkerNotFound

__all__ = ["find_session", "list_sessions"]


def list_sessions(*, run: str | None = None, home: Any = None, include_released: bool = False,
                  live: bool | None = None) -> list[DebugSession]:
    """Debug sessions: live from the writer's mailbox when connected, else from the evidence store.

    ``live=True`` requires the writer; ``live=False`` reads only the store.
    Released sessions are left out unless ``include_released``.
    """
    rows: list[dict[str, Any]] = []
    ray = sys.modules.get("ray")
    connected = ray is not None and ray.is_initialized()
    if live is not False and ray is not None and connected:
        # lazy: rs.breakpoint stays light to import: this loads when a session opens
        from raysleuth.recorder import get_writer

        try:
            rows = list(ray.get(get_writer(create=False).read.remote(TOPIC), timeout=30).values())
        except ValueError:
            rows = []  # no writer yet: nothing recorded
    else:
        # lazy: rs.breakpoint stays light to import: this loads when a session opens
        from raysleuth.recorder import open_store

        store = open_store(run, home=home)
        try:
            rows = [record.raw for record in evidence.read(store, evidence.DebugSessionRecord)]
        finally:
            store.close()
    sessions = latest_states(rows)
    if not include_released:
        sessions = [session for session in sessions if session.state != "released"]
    return sessions


def find_session(session_id: str, sessions: list[DebugSession]) -> DebugSession:
    """The session whose id is (or starts with) ``session_id``; raises ``WorkerNotFound``/``UsageError``."""

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
