"""``raysleuth logs``: the run's rank-tagged log records, filtered, followed, aggregated; raw Ray logs."""

from __future__ import annotations

import datetime
import json
from typing import Annotated

import typer
from rich.markup import escape

from raysleuth.cli._app import (
    AddressOption, HomeOption, JobOption, JsonOption, RanksOption, RunOption, SinceOption, StepsOption, app,
    at_least_one, check_ranks, connect, console, duration_option, emit_json, finish, home_path, name_run, positive, to_jsonable,
)
from raysleuth.errors import UsageError

_LEVEL_STYLE = {"DEBUG": "dim", "INFO": "", "WARNING": "yellow", "ERROR": "red", "CRITICAL": "bold red"}


def _clock(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment).strftime("%H:%M:%S.%f")[:-3]


def _print_line(line) -> None:
    style = _LEVEL_STYLE.get(line.level or "", "")
    where = f" step {line.step}" if line.step is not None else ""
    text = (f"[dim]{_clock(line.time)}[/dim] [cyan]\\[{escape(line.label)}][/cyan]{where} "
            f"[{style or 'default'}]{escape(line.level or '-'):<7}[/{style or 'default'}] "
            f"[dim]{escape(line.name or '')}:[/dim] {escape(line.message)}")
    console.print(text, soft_wrap=True)
    if line.exc_text:
        console.print(f"[red]{escape(line.exc_text)}[/red]", soft_wrap=True)


@app.command()
def logs(
    rank: RanksOption = None,
    level: Annotated[str | None, typer.Option("--level", help="Only this level and above (DEBUG..CRITICAL).")] = None,
    grep: Annotated[str | None, typer.Option("--grep", help="Only messages matching this regular expression.")] = None,
    since: SinceOption = None,
    step: StepsOption = None,
    name: Annotated[str | None, typer.Option("--name", help="Only this logger (and its children).")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Only the newest N matching records.", callback=at_least_one)] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new records as they arrive.")] = False,
    max_records: Annotated[int | None, typer.Option("--max-records", help="With --follow: stop after N records.", callback=at_least_one)] = None,
    follow_timeout: Annotated[float | None, duration_option("--timeout", help="With --follow: stop after this long.", check=positive)] = None,
    aggregate: Annotated[bool, typer.Option("--aggregate", help="Collapse same-template lines across ranks; show differing ranks apart.")] = False,
    ray_logs: Annotated[bool, typer.Option("--ray", help="Raw Ray stdout/stderr of one worker (needs a cluster).")] = False,
    pid: Annotated[int | None, typer.Option("--pid", help="With --ray: the worker's pid.", callback=at_least_one)] = None,
    actor_id: Annotated[str | None, typer.Option("--actor-id", help="With --ray: the worker's actor id.")] = None,
    tail: Annotated[int, typer.Option("--tail", help="With --ray: last N lines of each file.", callback=at_least_one)] = 1000,
    address: AddressOption = None,
    json_: JsonOption = False,
    run: RunOption = None,
    job: JobOption = None,
    home: HomeOption = None,
) -> None:
    """Logs of every rank from the evidence store: filter by rank, level, regex, time, step; follow; aggregate."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth import logs as rs_logs

    home_dir = home_path(home)
    if ray_logs:
        _ray_logs(rank, pid=pid, actor_id=actor_id, grep=grep, tail=tail, address=address, run=run, home=home_dir,
                  json_=json_)
    query = rs_logs.LogQuery(ranks=rank, level=level, grep=grep, since=since, step=step, name=name,
                             limit=limit, jobs=job or None)
    query.compiled()  # bad --level / --grep: one red line before anything else
    if not follow or run is not None:
        run = name_run(run, home_dir)
        check_ranks(rank, run, home=home_dir)
    if follow:
        for line in rs_logs.follow_logs(query, run=run, home=home_dir, max_records=max_records,
                                        timeout=follow_timeout):
            if json_:
                typer.echo(json.dumps(to_jsonable(line.to_dict()), default=repr))
            else:
                _print_line(line)
        finish(0)
    lines = rs_logs.query_logs(query, run=run, home=home_dir)
    if aggregate:
        _print_aggregated(lines, json_)
    elif json_:
        emit_json([line.to_dict() for line in lines])
    else:
        for line in lines:
            _print_line(line)
        if not lines:
            console.print("[dim]no log records match[/dim]")
    finish(0)


def _ray_logs(rank: list[int] | None, *, pid: int | None, actor_id: str | None, grep: str | None, tail: int,
              address: str | None, run: str | None, home, json_: bool) -> None:
    """``logs --ray``: one worker's raw Ray stdout/stderr files (exit 1 when none could be read)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth import logs as rs_logs

    if rank and len(rank) > 1:
        raise UsageError("--ray takes one worker", fix="pass a single --rank, --pid or --actor-id")
    pattern = rs_logs.LogQuery(grep=grep).compiled()["pattern"] if grep else None  # bad --grep: one line, first
    connect(address)
    pulled = rs_logs.ray_worker_logs(rank=rank[0] if rank else None, pid=pid, actor_id=actor_id, tail=tail,
                                     run=run, home=home)
    if pattern is not None:
        for item in pulled:
            item.lines = [text for text in item.lines if pattern.search(text)]
    if json_:
        emit_json([item.to_dict() for item in pulled])
    else:
        for item in pulled:
            where = f"actor {item.actor_id}, pid {item.pid}, node {item.node_ip or item.node_id}"
            console.print(f"[bold]== {escape(item.label)} std{item.stream} ({escape(where)})[/bold]", soft_wrap=True)
            if item.error:
                console.print(f"[yellow]{escape(item.error)}[/yellow]")
            for text in item.lines:
                console.print(f"[cyan]\\[{escape(item.label)}][/cyan] {escape(text)}", soft_wrap=True)
    finish(0 if any(item.error is None for item in pulled) else 1)


def _print_aggregated(lines, json_: bool) -> None:
    """``logs --aggregate``: same-template lines across ranks as one, the rank that differs apart."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth import logs as rs_logs

    grouped = rs_logs.aggregate(lines)
    if json_:
        emit_json([item.to_dict() for item in grouped])
        return
    for item in grouped:
        style = "yellow" if item.differs else _LEVEL_STYLE.get(item.level, "") or "default"
        where = f" step {item.step}" if item.step is not None else ""
        suffix = "  [bold yellow]<- differs[/bold yellow]" if item.differs else ""
        console.print(f"[cyan]\\[{escape(item.label)}][/cyan]{where} [{style}]{escape(item.message)}[/{style}]"
                      f"{suffix}", soft_wrap=True)
    console.print(f"[dim]{len(lines)} records -> {len(grouped)} lines[/dim]")
