"""``raysleuth tasks`` and ``raysleuth trace TASK_ID``."""

from __future__ import annotations

import datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from raysleuth.cli._app import (
    AddressOption, HomeOption, JsonOption, RunOption, app, console, duration_option, emit_json, finish, home_path,
    name_run,
)
from raysleuth.cli._app import at_least_one, non_negative, positive  # option checks
from raysleuth.errors import UsageError


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _table(*columns: str) -> Table:
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


@app.command()
def tasks(
    address: AddressOption = None,
    pending: Annotated[bool, typer.Option("--pending", help="Tasks, actors and placement groups that wait, and why.")] = False,
    stuck: Annotated[bool, typer.Option("--stuck", help="Running calls far slower than their peers.")] = False,
    failed: Annotated[bool, typer.Option("--failed", help="Failed tasks with error, cause and fix.")] = False,
    dead: Annotated[bool, typer.Option("--dead", help="Dead actors with death cause and rank.")] = False,
    older_than: Annotated[float, duration_option("--older-than", help="How long a task may wait before it counts as a problem.", check=non_negative)] = 60.0,
    stuck_factor: Annotated[float, typer.Option("--stuck-factor", help="Stuck past this many times the peers' median.", callback=positive)] = 5.0,
    stuck_floor: Annotated[float, duration_option("--stuck-floor", help="...and past this long.", check=non_negative)] = 10.0,
    job: Annotated[str | None, typer.Option("--job", help="Only this Ray job id.")] = None,
    stack: Annotated[bool, typer.Option("--stack", help="Add py-spy stacks of stuck workers.")] = False,
    limit: Annotated[int, typer.Option("--limit", help="Rows shown per section (JSON has all).", callback=at_least_one)] = 50,
    record: Annotated[bool, typer.Option("--record/--no-record",
                                         help="Keep classified deaths in the run's evidence (crashes, report).")] = True,
    run: RunOption = None,
    home: HomeOption = None,
    json_: JsonOption = False,
) -> None:
    """Why tasks wait, which calls are stuck, what failed and which workers died, with rank and cause (exit 1 if any).

    With --run (and --dead): the deaths a run recorded, read from its store after the cluster is gone."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.tasks import find_tasks

    if run is not None:
        _stored(run, home, pending or stuck or failed, json_, limit)
    everything = not (pending or stuck or failed or dead)
    report = find_tasks(address, pending=pending or everything, stuck=stuck or everything,
                        failed=failed or everything, dead=dead or everything, older_than=older_than,
                        stuck_factor=stuck_factor, stuck_floor_s=stuck_floor, job_id=job, stack=stack)
    _record(report, record)
    if json_:
        emit_json(report.to_dict())
        finish(1 if report.problem else 0)
    render_tasks(report, limit=limit)
    finish(1 if report.problem else 0)


def _stored(run: str, home, live_only: bool, json_: bool, limit: int) -> None:
    """``tasks --dead --run RUN``: the run's recorded deaths, root causes first (no cluster needed)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.deaths import root_first, stored_deaths
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.tasks import TaskReport

    if live_only:
        raise UsageError("--run reads a stored run: only --dead works there",
                         fix="raysleuth tasks --dead --run RUN; --pending, --stuck and --failed need the live cluster")
    report = TaskReport(deaths=root_first(stored_deaths(name_run(run, home), home=home_path(home))))
    if json_:
        emit_json(report.to_dict())
    else:
        render_tasks(report, limit=limit)
    finish(1 if report.problem else 0)


def _task_cell(name: str, task_id: str) -> Text:
    """A task's name and short id, on one line (the id never wraps: one record per line in a pipe)."""
    cell = Text(name or "?")
    cell.append(f" {task_id[:16]}", style="dim")
    return cell


def render_tasks(report, *, limit: int = 50) -> None:
    """Draw a :class:`~raysleuth.tasks.TaskReport`; every text that came from the job or Ray is escaped."""
    shown_any = False
    if report.pending:
        shown_any = True
        console.print(f"[bold]Pending ({len(report.pending)})[/bold]")
        table = _table("", "task", "state", "waiting", "reason", "detail")
        for item in sorted(report.pending, key=lambda p: -(p.waiting_s or 0))[:limit]:
            mark = "[red]✗[/red]" if item.problem else "[yellow]…[/yellow]"
            table.add_row(mark, _task_cell(item.name, item.task_id), escape(item.state), _age(item.waiting_s),
                          f"[bold]{escape(item.reason)}[/bold]", Text(item.detail or ""))
        console.print(table)
    if report.stuck:
        shown_any = True
        _render_stuck(report.stuck, limit)
    if report.failed:
        shown_any = True
        console.print(f"\n[bold red]Failed ({len(report.failed)})[/bold red]")
        table = _table("task", "error", "rank", "cause / fix")
        for item in report.failed[-limit:]:
            last_line = (item.error_message.strip().splitlines() or [""])[-1][:200]
            fix = Text(item.cause or "")
            if item.cause and item.fix:
                fix.append(f"\n→ {item.fix}", style="green")
            table.add_row(_task_cell(item.name, item.task_id), Text(f"{item.error_type or '?'}: {last_line}"),
                          "" if item.rank is None else str(item.rank), fix)
        console.print(table)
    if report.deaths:
        # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
        from raysleuth.deaths import root_first

        shown_any = True
        print_deaths(root_first(report.deaths)[:limit])  # a death with a cause of its own before those it caused
    for warning in report.warnings:
        console.print(f"[yellow]⚠️  {escape(warning)}[/yellow]", soft_wrap=True)
    if not shown_any:
        console.print("[green]nothing pending, stuck, failed or dead[/green]")


def _render_stuck(stuck, limit: int) -> None:
    console.print(f"\n[bold red]Stuck ({len(stuck)})[/bold red]")
    table = _table("task", "running", "peers' median", "ratio", "rank", "node / pid")
    for item in stuck[:limit]:
        table.add_row(_task_cell(item.name, item.task_id), _age(item.running_s),
                      f"{_age(item.peer_median_s)} ({item.peers} peers)", f"{item.ratio:.0f}×",
                      "" if item.rank is None else str(item.rank), f"{item.node_ip or '?'} / {item.pid or '?'}")
    console.print(table)
    for item in stuck:
        if item.stack:
            print_stack(item.stack, pid=item.pid)


def print_stack(stack, *, pid: int | None, frames: int = 12) -> None:
    """One process's py-spy stack (a ``ProcessStack`` as a dict): each thread, innermost frame first."""
    if not isinstance(stack, dict):
        console.print(Text(f"stack of pid {pid}: {stack}"), soft_wrap=True)
        return
    console.print(f"[dim]stack of pid {pid}:[/dim]")
    if stack.get("error"):
        console.print(Text(f"  {stack['error']}", style="yellow"), soft_wrap=True)
    for thread in stack.get("threads") or []:
        state = "idle" if thread.get("idle") else "active"
        console.print(Text(f"  thread {thread.get('name') or '?'} ({thread.get('role') or '?'}, {state})",
                           style="bold"), soft_wrap=True)
        listed = thread.get("frames") or []
        for frame in listed[:frames]:
            where = f"{frame.get('short_file') or frame.get('file') or '?'}:{frame.get('line')}"
            console.print(Text(f"    {frame.get('function') or '?'} ({where})"), soft_wrap=True)
        if len(listed) > frames:
            console.print(f"    [dim]... {len(listed) - frames} outer frames (use --json)[/dim]")
    if stack.get("folded_threads"):
        console.print(f"  [dim]{stack['folded_threads']} idle background thread(s) left out[/dim]")


def _record(report, record: bool) -> None:
    if record and report.deaths:
        # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
        from raysleuth.deaths import DeathReport, record_deaths

        record_deaths(DeathReport(deaths=report.deaths))


def print_deaths(deaths, *, lines: int = 3) -> None:
    """Each death: rank, classified cause, the evidence that decided it, and its last moments."""
    console.print(f"\n[bold red]Deaths ({len(deaths)})[/bold red]")
    for death in deaths:
        rank = "rank ?" if death.rank is None else f"rank {death.rank}"
        source = f" [dim](rank from {escape(death.rank_source)})[/dim]" if death.rank_source else ""
        who = escape(death.actor_name or death.actor_class or "task worker")
        console.print(f"[bold]{rank}[/bold]{source} {who} [dim]pid {death.pid or '?'} on {escape(death.node_ip or '?')}"
                      f"{'  ' + escape(death.task) if death.task else ''}[/dim]", soft_wrap=True)
        console.print(f"  [bold red]{escape(death.cause)}[/bold red]: {escape(death.summary)}", soft_wrap=True)
        for line in death.evidence:
            console.print(f"    · {escape(line)}", soft_wrap=True)
        if death.stack:
            frames = " ← ".join(f"{frame['function']} ({frame['file'].rsplit('/', 1)[-1]}:{frame['line']})"
                                for frame in death.stack[:4])
            console.print(f"    stack: {escape(frames)}", soft_wrap=True)
        if death.memory_samples:
            last = death.memory_samples[-1]
            console.print(f"    last memory sample: rss {(last.get('rss_bytes') or 0) / 2**20:,.0f} MiB", soft_wrap=True)
        waiting = [str(peer["rank"]) for peer in death.peers if peer.get("beat_after_death") is False]
        if waiting:
            console.print(f"    peers with no heartbeat since: rank {', '.join(waiting)}", soft_wrap=True)
        for name, tail in (("stdout", death.last_stdout), ("stderr", death.last_stderr)):
            for line in tail[-lines:]:
                console.print(f"    [dim]{name}| {escape(line[:200])}[/dim]", soft_wrap=True)
        if death.fix:
            console.print(f"  [green]→ {escape(death.fix)}[/green]", soft_wrap=True)


@app.command()
def trace(
    task_id: Annotated[str, typer.Argument(help="Task id (or object id) from `raysleuth tasks` or `ray list tasks`.")],
    address: AddressOption = None,
    wait: Annotated[float, duration_option("--wait", help="How long to wait for the task's events to arrive.", check=non_negative)] = 5.0,
    json_: JsonOption = False,
) -> None:
    """The lifecycle of one task: each state with its time and duration, node, worker, retries."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.tasks import trace_ray_task

    result = trace_ray_task(task_id, address, wait_s=wait)
    if json_:
        emit_json(result.to_dict())
        finish(1 if result.state == "FAILED" else 0)
    console.print(f"[bold]{escape(result.name)}[/bold] ({escape(result.type or '?')}, {escape(result.function or '?')}) "
                  f"[dim]{escape(result.task_id)}[/dim]", soft_wrap=True)
    console.print(f"state [bold]{result.state}[/bold], {len(result.attempts)} attempt(s), "
                  f"waited {_age(result.waiting_s)}, ran {_age(result.running_s)}, total {_age(result.total_s)}")
    for attempt in result.attempts:
        where = f"node {attempt.node_id[:12] if attempt.node_id else '?'}, pid {attempt.worker_pid or '?'}"
        console.print(f"\n[bold]attempt {attempt.attempt_number}[/bold] ({attempt.state}, {where})")
        table = _table("at", "state", "", "duration")
        for phase in attempt.phases:
            at = datetime.datetime.fromtimestamp(phase.start).strftime("%H:%M:%S.%f")[:-3]
            table.add_row(at, escape(phase.state), escape(phase.label or ""),
                          ("" if phase.state in ("FINISHED", "FAILED") else _age(phase.duration_s))
                          + (" (still)" if phase.end is None else ""))
        console.print(table)
        if attempt.error_type:
            last = ((attempt.error_message or "").strip().splitlines() or [""])[-1]
            console.print(f"[red]{escape(attempt.error_type)}[/red]: {escape(last)}", soft_wrap=True)
    finish(1 if result.state == "FAILED" else 0)
