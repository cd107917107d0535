"""``raysleuth debug``: list, attach to, and arm breakpoints in running workers."""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from raysleuth import agents
from raysleuth.cli._app import (
    AddressOption, HomeOption, JsonOption, RanksOption, RunOption, app, console, emit_json, err_console, finish,
    home_path,
)
from raysleuth.cli._app import writer_timeout  # the writer wait, bounded
from raysleuth.errors import ClusterUnreachable, UsageError

debug_app = typer.Typer(help="Breakpoints in Ray workers: list sessions, attach, arm/disarm at runtime.",
                        no_args_is_help=True)
app.add_typer(debug_app, name="debug")

AllOption = Annotated[bool, typer.Option("--all", help="Include released sessions.")]


def _sessions(address: str | None, run: str | None, home: Path | None, include_released: bool):
    """Live sessions from the cluster when it answers, else from the evidence store."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth import breakpoints, cluster

    if run is None:
        try:
            cluster.connect(address)
            return breakpoints.list_sessions(include_released=include_released, live=True), "live"
        except ClusterUnreachable:
            pass
    return breakpoints.list_sessions(run=run, home=home_path(home), include_released=include_released,
                                     live=False), "store"


@debug_app.command("ls")
def ls(
    address: AddressOption = None,
    run: RunOption = None,
    home: HomeOption = None,
    all_: AllOption = False,
    json_: JsonOption = False,
) -> None:
    """List debug sessions: waiting for a client, attached (and released with --all)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth import breakpoints

    sessions, source = _sessions(address, run, home, all_)
    open_debugpy = any(session.kind == "debugpy" and session.state != "released" for session in sessions)
    if json_:
        emit_json({"source": source, "sessions": [session.to_dict() for session in sessions],
                   "notes": [breakpoints.DEBUGPY_NOTE] if open_debugpy else []})
        finish(0)
    if not sessions:
        console.print(f"no debug sessions ({source}); arm breakpoints with `raysleuth debug arm` or RAYSLEUTH_DEBUG=1")
        finish(0)
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("id", "state", "kind", "rank", "node", "pid", "listen", "breakpoint", "where", "since"):
        table.add_column(column, overflow="fold")
    style = {"waiting": "yellow", "attached": "green", "released": "dim"}
    for session in sessions:
        age = time.time() - session.since
        table.add_row(session.id, f"[{style.get(session.state, '')}]{session.state}[/]", session.kind,
                      "" if session.rank is None else str(session.rank), session.node_ip or session.hostname or "",
                      str(session.pid), f"{session.host}:{session.port}", session.name or "",
                      f"{os.path.basename(session.file or '?')}:{session.line}", f"{age:.0f}s ago")
    console.print(table)
    console.print("attach: [bold]raysleuth debug attach ID[/bold] (pdb) or [bold]raysleuth debug vscode[/bold] (debugpy)")
    if open_debugpy:
        console.print(f"[yellow]note:[/yellow] {escape(breakpoints.DEBUGPY_NOTE)}")
    finish(0)


def _secret(session) -> str:
    """The pdb session's secret: from its 0600 file here, else through its node's agent."""
    path = session.secret_file
    if not path:
        raise UsageError(f"session {session.id} has no secret file (made by an older raysleuth?)",
                         fix="arm again and attach to the new session")
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        pass
    except OSError as error:
        raise UsageError(f"cannot read the secret of session {session.id} at {path} ({error.strerror or error})",
                         fix="run `raysleuth debug attach` as the user that runs the job") from None
    text = None
    if session.node_id:
        try:
            found = agents.call_agents("read_files", [path], timeout=20, nodes=[session.node_id])
            text = next((result.value or {}).get(path) for result in found if result.ok)
        except Exception:
            text = None
    if not text:
        raise UsageError(f"the secret of session {session.id} is gone ({path})",
                         fix="the session was attached or released: `raysleuth debug ls --all`")
    return text.strip()


def _bridge(host: str, port: int, secret: str, *, timeout: float = 10.0) -> int:
    """Connect the terminal to a pdb session (the secret first) until it closes."""
    try:
        connection = socket.create_connection((host, port), timeout=timeout)
        connection.sendall(secret.encode() + b"\n")
    except OSError as error:
        raise ClusterUnreachable(f"cannot connect to the pdb session at {host}:{port} ({error.strerror or error})",
                                 fix="it may have been released (`raysleuth debug ls --all`), or needs an SSH tunnel") from None
    connection.settimeout(None)
    stdin = sys.stdin
    stdin_open = True
    out = sys.stdout
    try:
        while True:
            watched = [connection] + ([stdin] if stdin_open else [])
            readable, _, _ = select.select(watched, [], [])
            if connection in readable:
                data = connection.recv(65536)
                if not data:
                    return 0
                out.write(data.decode("utf-8", errors="replace"))
                out.flush()
            if stdin_open and stdin in readable:
                line = stdin.readline()
                if not line:
                    stdin_open = False
                    connection.shutdown(socket.SHUT_WR)  # pdb sees EOF: the worker runs on
                else:
                    connection.sendall(line.encode())
    except KeyboardInterrupt:
        return 130
    finally:
        connection.close()


@debug_app.command("attach")
def attach(
    session_id: Annotated[str, typer.Argument(help="Session id (or its start), from `raysleuth debug ls`.")],
    address: AddressOption = None,
    run: RunOption = None,
    home: HomeOption = None,
    json_: JsonOption = False,
) -> None:
    """Attach: a terminal pdb (pdb kind), or the attach command / VS Code config (debugpy kind)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth import breakpoints

    sessions, _source = _sessions(address, run, home, True)
    session = breakpoints.find_session(session_id, sessions)
    how = breakpoints.attach_instructions(session)
    if json_:
        emit_json(how)
        finish(0)
    if session.state == "released":
        raise UsageError(f"session {session.id} was released ({session.reason or 'worker ran on'})",
                         fix="arm again and wait for the breakpoint to hit: `raysleuth debug ls`")
    if session.kind == "pdb":
        if how["ssh_tunnel"]:
            console.print(f"session {session.id} is on {session.node_ip}: open a tunnel first, in another terminal:\n"
                          f"  {how['ssh_tunnel']}")
        finish(_bridge(how["connect"]["host"], how["connect"]["port"], _secret(session)))
    console.print(f"debugpy session [bold]{session.id}[/bold]: rank {session.rank}, pid {session.pid}, "
                  f"{escape(session.location)}")
    console.print(f"[yellow]note:[/yellow] {escape(breakpoints.DEBUGPY_NOTE)}")
    if how["ssh_tunnel"]:
        console.print(f"1. forward the port (the server listens on 127.0.0.1 of {session.node_ip}):\n"
                      f"   {how['ssh_tunnel']}")
    console.print(f"connect a DAP client to {how['connect']['host']}:{how['connect']['port']}; "
                  "VS Code: `raysleuth debug vscode`, or add this to .vscode/launch.json:")
    sys.stdout.write(json.dumps(how["vscode"], indent=4) + "\n")
    finish(0)


@debug_app.command("vscode")
def vscode(
    address: AddressOption = None,
    run: RunOption = None,
    home: HomeOption = None,
    path: Annotated[Path, typer.Option("--path", help="The launch.json to write.")] = Path(".vscode/launch.json"),
    json_: JsonOption = False,
) -> None:
    """Write .vscode/launch.json: one attach configuration per waiting debugpy session (merged)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth import breakpoints

    sessions, _source = _sessions(address, run, home, False)
    configurations = []
    tunnels = []
    for session in sessions:
        if session.kind != "debugpy" or session.state != "waiting":
            continue
        how = breakpoints.attach_instructions(session)
        configurations.append(how["vscode"])
        if how["ssh_tunnel"]:
            tunnels.append(how["ssh_tunnel"])
    if path.is_dir():  # --path .vscode: the launch.json inside it
        path = path / "launch.json"
    try:
        document = breakpoints.write_launch_json(path, configurations)
    except ValueError as error:
        raise UsageError(f"{path} is not valid JSON ({error})", fix="fix or move the file, then run this again") from None
    except OSError as error:
        raise UsageError(f"cannot write {path} ({error.strerror or error})",
                         fix="pass --path to a writable file, e.g. --path .vscode/launch.json") from None
    if json_:
        emit_json({"path": str(path), "configurations": configurations, "ssh_tunnels": tunnels, "launch": document})
        finish(0)
    console.print(f"wrote {len(configurations)} raysleuth attach configuration(s) to {path}")
    for config in configurations:
        console.print(f"  {config['name']}  ->  {config['connect']['host']}:{config['connect']['port']}")
    for tunnel in tunnels:
        console.print(f"  tunnel first: {tunnel}")
    finish(0)


@debug_app.command("arm")
def arm(
    name: Annotated[str | None, typer.Argument(help="Only breakpoints with this name stop (default: all).")] = None,
    rank: RanksOption = None,
    address: AddressOption = None,
    json_: JsonOption = False,
) -> None:
    """Arm breakpoints in running workers (picked up within a few seconds, no restart)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth import breakpoints, cluster

    cluster.connect(address)
    _check_live_ranks(rank)
    value = breakpoints.arm_cluster(name, rank, timeout=writer_timeout())
    if json_:
        emit_json(value)
    else:
        what = f"breakpoints named {name!r}" if name else "all breakpoints"
        where = f"on rank(s) {', '.join(map(str, sorted(rank)))}" if rank else "on every rank"
        console.print(f"armed {what} {where}; workers pick it up within {breakpoints.POLL_INTERVAL:g}s")
    finish(0)


def _check_live_ranks(ranks: list[int] | None) -> None:
    """``--rank 99`` where no live worker has rank 99: one line naming the ranks that exist (exit 2). With no
    ranked worker alive yet (arming before the job starts), the arming stands and stderr says so."""
    if not ranks:
        return
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.labels.live import registered_labels

    try:
        known = sorted({label["rank"] for label in registered_labels().values() if label.get("rank") is not None})
    except Exception:  # no State API: arm as asked
        return
    unknown = [r for r in ranks if r not in known]
    if unknown and known:
        raise UsageError(f"no live worker has rank {', '.join(map(str, unknown))}; ranks alive: "
                         f"{', '.join(map(str, known))}", fix="pick one of those ranks, or leave --rank out")
    if unknown:
        err_console.print(f"[yellow]no live worker has a rank yet: rank(s) {', '.join(map(str, unknown))} "
                          "will stop once a worker with that rank starts[/yellow]")


@debug_app.command("disarm")
def disarm(
    address: AddressOption = None,
    reset: Annotated[bool, typer.Option("--reset", help="Forget runtime arming instead: each worker follows "
                                                          "its own RAYSLEUTH_DEBUG again.")] = False,
    json_: JsonOption = False,
) -> None:
    """Disarm breakpoints in running workers (also those armed by RAYSLEUTH_DEBUG=1)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth import breakpoints, cluster

    cluster.connect(address)
    if reset:
        breakpoints.reset_cluster(timeout=writer_timeout())
        if json_:
            emit_json({"reset": True})
        else:
            console.print("runtime arming cleared; workers follow their RAYSLEUTH_DEBUG again")
        finish(0)
    value = breakpoints.disarm_cluster(timeout=writer_timeout())
    if json_:
        emit_json(value)
    else:
        console.print(f"disarmed breakpoints; within {breakpoints.POLL_INTERVAL:g}s workers pick it up and "
                      "breakpoints waiting for a client let their worker run on (post-mortem sessions stay)")
    finish(0)
