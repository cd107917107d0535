"""Debug sessions: what a hit breakpoint publishes, and how users find it.

A session is published twice:

- as evidence (kind ``debug_session``, one record per state change:
  ``waiting`` -> ``attached`` -> ``released``), so the history outlives the
  job and ``debug ls`` works without a cluster;
- in the writer's mailbox topic :data:`TOPIC` (member = session id, value =
  the latest state), so ``raysleuth debug ls`` on a live cluster sees
  sessions at once, without waiting for a batch.

Pure helpers (attach instructions, VS Code configurations, merging
``launch.json``) take plain data and are unit tested without Ray.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import time
from pathlib import Path
from typing import Any, Literal, get_args

__all__ = [
    "CONTROL_KEY",
    "DEBUGPY_NOTE",
    "DebugSession",
    "STATES",
    "SessionState",
    "TOPIC",
    "attach_instructions",
    "local_addresses",
    "merge_launch_json",
    "vscode_configuration",
]

#: Writer mailbox topic holding the latest state of every session.
TOPIC = "debug_sessions"
#: Writer control key that arms/disarms breakpoints at runtime.
CONTROL_KEY = "debug"
#: What a debugpy session is open to (debugpy has no authentication of its own).
DEBUGPY_NOTE = ("debugpy has no authentication: any local user of that node who reaches its port can attach and "
                "run code as the job while it waits; it listens on 127.0.0.1 only, unless RAYSLEUTH_DEBUG_HOST says "
                "otherwise (RAYSLEUTH_DEBUGGER=pdb uses a per-session secret)")
#: Name prefix of the launch.json configurations raysleuth owns.
VSCODE_PREFIX = "raysleuth: "

SessionState = Literal["waiting", "attached", "released"]
"""A debug session: ``waiting`` for a client, ``attached``, ``released`` (the worker ran on)."""
STATES: tuple[SessionState, ...] = get_args(SessionState)


@dataclasses.dataclass(kw_only=True)
class DebugSession:
    """One breakpoint (or post-mortem) that opened a debug server."""

    id: str
    """Short unique id (``debug attach ID``)."""
    kind: str
    """``debugpy`` (attach with VS Code / any DAP client) or ``pdb`` (``debug attach``)."""
    state: SessionState
    """``waiting`` for a client, ``attached``, or ``released`` (the worker ran on)."""
    host: str
    """Interface the server listens on (127.0.0.1 unless the user chose another)."""
    port: int
    name: str | None = None
    """The breakpoint's name (``rs.breakpoint(name=...)``), ``post-mortem`` for crashes."""
    rank: int | None = None
    pid: int = 0
    node_id: str | None = None
    node_ip: str | None = None
    hostname: str | None = None
    actor_name: str | None = None
    actor_class: str | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    since: float = 0.0
    """When the breakpoint was hit (epoch seconds)."""
    updated: float = 0.0
    """When the state last changed."""
    reason: str | None = None
    """Why a session was released (``client detached``, ``no client within 600s``...)."""
    exception: str | None = None
    """For post-mortem sessions: the exception, as ``Type: message``."""
    secret_file: str | None = None
    """pdb sessions: the 0600 file (on the session's node) holding the secret a client sends first."""

    @property
    def location(self) -> str:
        """``file:line`` of the stop."""
        return f"{self.file}:{self.line}" if self.file else "?"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (with ``location``)."""
        data = dataclasses.asdict(self)
        data["location"] = self.location
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DebugSession":
        """Rebuild from :meth:`to_dict` output (unknown keys ignored)."""
        names = {field.name for field in dataclasses.fields(cls)}
        kept = {key: value for key, value in data.items() if key in names}
        for field in dataclasses.fields(cls):  # a row another writer left: a clear ValueError, not a bad session
            value = kept.get(field.name)
            allowed = _FIELD_TYPES.get(str(field.type).replace(" ", ""))
            if value is not None and allowed and (not isinstance(value, allowed) or isinstance(value, bool)
                                                  and bool not in allowed):
                raise ValueError(f"debug session field {field.name}={value!r} is not {field.type}")
        return cls(**kept)


_FIELD_TYPES = {"str": (str,), "str|None": (str,), "int": (int,), "int|None": (int,), "float": (int, float),
                "float|None": (int, float)}


def local_addresses() -> set[str]:
    """IP addresses of this machine (to tell whether a session's node is remote)."""
    found = {"127.0.0.1", "::1", "localhost"}
    try:
        import psutil

        for addresses in psutil.net_if_addrs().values():
            for address in addresses:
                if address.family in (socket.AF_INET, socket.AF_INET6):
                    found.add(address.address.split("%")[0])
    except Exception:
        pass
    try:
        found.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    return found


def _is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def attach_instructions(session: DebugSession, *, local_ips: set[str] | None = None) -> dict[str, Any]:
    """How to reach ``session`` from this machine: the address, an SSH tunnel if needed, commands.

    A server on 127.0.0.1 of another node is reached through
    ``ssh -N -L PORT:127.0.0.1:PORT NODE_IP``; the returned ``connect`` is
    then ``127.0.0.1:PORT`` on this machine.
    """
    local_ips = local_addresses() if local_ips is None else local_ips
    remote = bool(session.node_ip) and session.node_ip not in local_ips
    tunnel = None
    connect_host: str | None = session.host
    if remote and _is_loopback(session.host):
        tunnel = f"ssh -N -L {session.port}:127.0.0.1:{session.port} {session.node_ip}"
        connect_host = "127.0.0.1"
    elif session.host in ("0.0.0.0", "::"):
        connect_host = session.node_ip if remote else "127.0.0.1"
    result: dict[str, Any] = {
        "id": session.id,
        "kind": session.kind,
        "remote": remote,
        "ssh_tunnel": tunnel,
        "connect": {"host": connect_host, "port": session.port},
    }
    if session.kind == "pdb":
        result["command"] = f"raysleuth debug attach {session.id}"
        result["secret_file"] = session.secret_file
        # the secret goes first, as one line; `raysleuth debug attach` does this for you
        result["netcat"] = f"(cat {session.secret_file or 'SECRET_FILE'}; cat) | nc {connect_host} {session.port}"
    else:
        result["authentication"] = DEBUGPY_NOTE
        result["vscode"] = vscode_configuration(session, host=connect_host)
        result["command"] = "raysleuth debug vscode   # then Run and Debug -> " + result["vscode"]["name"]
    return result


def vscode_configuration(session: DebugSession, *, host: str | None = None) -> dict[str, Any]:
    """A VS Code ``launch.json`` attach configuration for a debugpy session."""
    who = f"rank {session.rank}" if session.rank is not None else (session.actor_name or "worker")
    label = f"{VSCODE_PREFIX}{who} {session.name or 'breakpoint'} pid {session.pid} [{session.id}]"
    return {
        "name": label,
        "type": "debugpy",
        "request": "attach",
        "connect": {"host": host or session.host, "port": session.port},
        "justMyCode": False,
    }


def _strip_jsonc(text: str) -> str:
    """Remove // and /* */ comments and trailing commas (VS Code writes JSONC)."""
    out, index, in_string = [], 0, False
    while index < len(text):
        char = text[index]
        if in_string:
            out.append(char)
            if char == "\\" and index + 1 < len(text):
                out.append(text[index + 1])
                index += 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
            out.append(char)
        elif text.startswith("//", index):
            end = text.find("\n", index)
            index = len(text) if end < 0 else end
            continue
        elif text.startswith("/*", index):
            end = text.find("*/", index + 2)
            index = len(text) if end < 0 else end + 2
            continue
        else:
            out.append(char)
        index += 1
    return re.sub(r",(\s*[}\]])", r"\1", "".join(out))


def merge_launch_json(existing: str | None, configurations: list[dict[str, Any]]) -> dict[str, Any]:
    """``launch.json`` content with raysleuth's configurations replaced by ``configurations``.

    The user's own configurations (and other keys) are kept. Raises
    ``ValueError`` when ``existing`` is not JSON (with comments allowed).
    """
    document: dict[str, Any] = {"version": "0.2.0", "configurations": []}
    if existing and existing.strip():
        parsed = json.loads(_strip_jsonc(existing))
        if not isinstance(parsed, dict):
            raise ValueError("launch.json does not hold a JSON object")
        document = parsed
        document.setdefault("version", "0.2.0")
    kept = [config for config in document.get("configurations", []) or []
            if not (isinstance(config, dict) and str(config.get("name", "")).startswith(VSCODE_PREFIX))]
    document["configurations"] = kept + list(configurations)
    return document


def write_launch_json(path: Path, configurations: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge ``configurations`` into the ``launch.json`` at ``path`` (created if missing)."""
    path = Path(path)
    existing = path.read_text(encoding="utf-8") if path.exists() else None
    document = merge_launch_json(existing, configurations)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=4) + "\n", encoding="utf-8")
    tmp.replace(path)
    return document


def latest_states(rows: list[dict[str, Any]]) -> list[DebugSession]:
    """From many session snapshots (any order), the newest state of each session."""
    newest: dict[str, dict[str, Any]] = {}
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            continue
        current = newest.get(row["id"])
        if not isinstance(row.get("updated") or 0.0, (int, float)):
            continue
        order = (row.get("updated") or 0.0, STATES.index(row["state"]) if row.get("state") in STATES else 0)
        if current is None or order >= (current.get("updated") or 0.0,
                                        STATES.index(current["state"]) if current.get("state") in STATES else 0):
            newest[row["id"]] = row
    sessions = []
    for row in newest.values():
        try:
            sessions.append(DebugSession.from_dict(row))
        except (TypeError, ValueError):
            continue
    sessions.sort(key=lambda session: (session.since, session.id))
    return sessions


def now() -> float:
    """Wall-clock time (one place, so tests can reason about it)."""
    return time.time()
