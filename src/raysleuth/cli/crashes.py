"""``raysleuth crashes`` and ``raysleuth crashes show ID``: the crash capsules of a run."""

from __future__ import annotations

import datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from raysleuth.cli._app import (
    AddressOption, HomeOption, JobOption, JsonOption, RanksOption, RunOption, app, at_least_one, console,
    emit_json, finish, home_path, name_run,
)
from raysleuth.cli.tasks import print_deaths
from raysleuth.errors import UsageError
from raysleuth.evidence import Crash

crashes_app = typer.Typer(
    help="Crash capsules left by workers (@rs.capture_crashes): list them, or show one fully.",
    no_args_is_help=False,
)
app.add_typer(crashes_app, name="crashes")


def _when(epoch: float | None) -> str:
    if not epoch:
        return ""
    return datetime.datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")


@crashes_app.callback(invoke_without_command=True)
def crashes(
    ctx: typer.Context,
    rank: RanksOption = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Only the newest N capsules.", callback=at_least_one)] = None,
    collect: Annotated[bool, typer.Option("--collect", help="First classify the deaths of the running cluster "
                                                             "(--address) and record them.")] = False,
    address: AddressOption = None,
    run: RunOption = None,
    job: JobOption = None,
    home: HomeOption = None,
    json_: JsonOption = False,
) -> None:
    """List crash capsules and worker deaths (exit 1 when there are any). Reads the evidence store: works after
    the cluster is gone; deaths are there once `raysleuth tasks --dead` or `crashes --collect` classified them."""
    if ctx.invoked_subcommand is not None:
        return
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.deaths import consequences, find_deaths, record_deaths, root_first, stored_deaths
    from raysleuth.postmortem import list_crashes

    run = name_run(run, home)
    if collect or address:
        record_deaths(find_deaths(address))
    found = list_crashes(run, home=home_path(home), rank=rank, limit=limit, job=job or None)
    deaths = root_first(stored_deaths(run, home=home_path(home)))
    caused = consequences(deaths, [(item.id, item.rank, item.time, item.message) for item in found])
    if rank:
        deaths = [death for death in deaths if death.rank in rank]
    if json_:
        emit_json([{"kind": "death", "id": death.record_id, **death.to_dict()} for death in deaths]
                  + [{"kind": "capsule", **item.to_dict(), "consequence_of": _root(caused.get(item.id))}
                     for item in found])
        finish(1 if found or deaths else 0)
    if deaths:
        print_deaths(deaths, lines=2)
        console.print("")
    if not found:
        console.print("[green]no crash capsules recorded[/green]")
        finish(1 if deaths else 0)
    render_crashes(found, caused)
    finish(1)


def _root(death) -> dict | None:
    """A capsule's root cause in JSON: the rank whose death it follows."""
    if death is None:
        return None
    return {"death_id": death.record_id, "rank": death.rank, "cause": death.cause, "actor_id": death.actor_id}


@crashes_app.command("show")
def show(
    capsule_id: Annotated[int, typer.Argument(metavar="ID", help="Capsule id from `raysleuth crashes`.")],
    run: RunOption = None,
    home: HomeOption = None,
    json_: JsonOption = False,
) -> None:
    """Print one crash capsule fully: chain, traceback, locals per frame, memory, environment, cause and fix."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.postmortem import get_crash

    run = name_run(run, home)
    try:
        record = get_crash(capsule_id, run, home=home_path(home))
    except UsageError:
        # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
        from raysleuth.deaths import stored_deaths

        death = next((d for d in stored_deaths(run, home=home_path(home)) if d.record_id == capsule_id), None)
        if death is None:
            raise
        if json_:
            emit_json({"kind": "death", **death.to_dict()})
            finish(0)
        print_deaths([death], lines=20)
        finish(0)
    if json_:
        emit_json(record.to_record_dict())
        finish(0)
    render_capsule(record)
    finish(0)


def render_crashes(found, caused: dict | None = None) -> None:
    """The capsule table, one capsule per line (messages and causes come from the job: escaped).

    ``caused``: capsule id -> the peer's death it follows (:func:`raysleuth.deaths.consequences`).
    """
    caused = caused or {}
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("id", "time", "rank", "node", "pid", "actor.method", "exception", "likely cause"):
        table.add_column(column, overflow="fold")
    for item in found:
        where = item.method or ""
        if item.actor and not where.startswith(item.actor.split(":")[0]):
            where = f"{item.actor}:{where}"
        table.add_row(
            str(item.id), _when(item.time), "" if item.rank is None else str(item.rank),
            escape(item.node_ip or item.hostname or ""), "" if item.pid is None else str(item.pid), escape(where),
            f"[red]{escape(item.exception_type)}[/red]: {escape(_short(item.message))}", _cause(item, caused.get(item.id)),
        )
    console.print(table)
    console.print(f"\n[red]{len(found)} crash capsule(s)[/red]; details: raysleuth crashes show ID")


def render_capsule(capsule: Crash) -> None:
    """One capsule fully: chain, traceback, locals per frame, memory, environment, cause and fix."""
    rank = capsule.rank if "rank" in capsule.raw else capsule.row.rank
    console.print(f"[bold]crash {capsule.row.id}[/bold]  {_when(capsule.row.time)}  rank {escape(str(rank))}  "
                  f"node {escape(str(capsule.node_ip or capsule.hostname))}  pid {escape(str(capsule.pid))}",
                  soft_wrap=True)
    who = " ".join(part for part in (capsule.actor_class, capsule.actor_name and f"({capsule.actor_name})",
                                     capsule.method and f"method {capsule.method}") if part)
    if who:
        console.print(who, markup=False)
    console.print(f"\n[red bold]{escape(capsule.exception_type)}[/red bold]: {escape(capsule.message)}", soft_wrap=True)
    if len(capsule.chain) > 1:
        console.print("\n[bold]exception chain[/bold] (outermost first)")
        for link in capsule.chain:
            console.print(f"  {str(link.relation):>7}  {link.type}: {_first(str(link.message))}",
                          markup=False, soft_wrap=True)
    if capsule.explanations:
        console.print("\n[bold]likely cause[/bold]")
        for number, match in enumerate(capsule.explanations):
            label = "root" if number == 0 else "also"
            console.print(f"  [{'yellow' if number == 0 else 'dim'}]{label}[/]: [bold]{escape(str(match.title))}[/bold]")
            if number == 0:
                console.print(f"    cause: {escape(str(match.cause))}", soft_wrap=True)
                console.print(f"    [green]fix: {escape(str(match.fix))}[/green]", soft_wrap=True)
    console.print("\n[bold]traceback[/bold]")
    console.print(capsule.traceback, markup=False, highlight=False, soft_wrap=True)
    console.print("[bold]frames and locals[/bold] (innermost last)")
    for frame in capsule.frames:
        console.print(f"  {escape(str(frame.file))}:{frame.line} in [bold]{escape(str(frame.function))}[/bold]",
                      soft_wrap=True)
        if frame.code:
            console.print(f"      {frame.code}", markup=False, soft_wrap=True)
        for name, value in frame.locals.items():
            console.print(f"      {name} = {value}", markup=False, soft_wrap=True)
    if capsule.memory:
        console.print("\n[bold]memory[/bold]")
        for key, value in capsule.memory.items():
            console.print(f"  {key}: {_bytes(key, value)}", markup=False)
    if capsule.environment:
        console.print("\n[bold]environment[/bold] (redacted)")
        for key, value in capsule.environment.items():
            console.print(f"  {key}={value}", markup=False, soft_wrap=True)
    for problem in capsule.errors:
        console.print(f"[yellow]capture note: {escape(problem)}[/yellow]", soft_wrap=True)


def _cause(item, death) -> str:
    if death is not None:
        who = "rank ?" if death.rank is None else f"rank {death.rank}"
        return f"[yellow]consequence of {who}'s death ({escape(death.cause)})[/yellow]"
    return escape(item.cause) if item.cause else "[dim]unknown[/dim]"


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first(text: str) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


def _bytes(key: str, value) -> str:
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{value / 2**20:,.1f} MiB"
    return str(value)
