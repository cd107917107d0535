"""``raysleuth stacks`` and ``raysleuth watch``: hang forensics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from raysleuth.cli._app import (
    AddressOption, HomeOption, JsonOption, RanksOption, app, connect, console, duration_option, emit_json,
    err_console, finish, home_path, to_jsonable,
)
from raysleuth.cli._app import positive  # option checks
from raysleuth.cli.stragglers import watch_slow
from raysleuth.errors import UsageError

MAX_FRAMES = 12


def render_report(report, *, show_frames: int = MAX_FRAMES, out=None) -> None:
    """Draw a StackReport: groups with their frames, the verdict, what is missing."""
    out = out or console
    by_key = {(p.node_ip, p.pid): p for p in report.processes}
    drivers = [p for p in report.processes if p.role == "driver"]
    samples = f", 2 samples {report.interval:g}s apart" if report.samples > 1 else ", one sample"
    out.print(f"[bold]{len(report.processes)} processes[/bold] on {report.nodes} node(s), "
              f"{len(report.groups)} distinct stacks ({report.seconds:.1f}s{samples}"
              f"{', native' if report.native else ''}{', partial' if report.partial else ''})")
    for group in report.groups:
        members = [by_key.get(tuple(m)) for m in group.members]
        who = _who(group, members)
        style = "yellow" if group.count == 1 and len(report.groups) > 1 else "cyan"
        out.print(f"\n[{style}][bold]{who}[/bold][/{style}]  {escape(group.headline)}")
        for member in members[:8]:
            if member is None:
                continue
            extra = f"  task {member.task_name}" if member.task_name else ""
            parent = f"  child of pid {member.parent_pid}" if member.parent_pid else ""
            source = f"  rank from {member.rank_source}" if member.rank_source else ""
            activity = f"  {member.activity}" if member.activity else ""
            out.print(f"  [dim]{escape(member.label)}  {member.role}{escape(extra)}{parent}{escape(source)}"
                      f"{activity}[/dim]")
        if len(members) > 8:
            out.print(f"  [dim]... and {len(members) - 8} more[/dim]")
        for line in frame_lines(group.frames, show_frames):
            out.print(line)
    verdict = report.verdict
    if verdict.chains:
        out.print("\n[bold]wait-for chains[/bold]")
        for chain in verdict.chains:
            out.print("  " + escape(" → ".join(_link(link) for link in chain)))
    elif drivers and not verdict.chains:
        out.print(f"\n[dim]{len(drivers)} driver(s); none blocked in ray.get on a visible call[/dim]")
    if report.missing:
        out.print(f"\n[yellow]missing ({len(report.missing)}):[/yellow]")
        for item in report.missing:
            where = " ".join(x for x in (item.node_ip or "", f"pid {item.pid}" if item.pid else "") if x)
            out.print(f"  [yellow]{escape(where)}[/yellow] {escape(item.reason)}")
    for note in verdict.notes:
        out.print(f"[dim]note: {escape(note)}[/dim]")
    if verdict.signals:
        out.print(f"[dim]decided by: {escape('; '.join(verdict.signals))}[/dim]")
    out.print()
    if verdict.problem:
        out.print(f"[red bold]verdict:[/red bold] [red]{escape(verdict.summary)}[/red]")
        title = "root cause" if verdict.state == "culprit" else "in the cycle"
        for culprit in verdict.culprits:
            name = f"rank {culprit.rank}" if culprit.rank is not None else "no rank"
            source = f" (from {culprit.rank_source})" if culprit.rank_source else ""
            place = f"{culprit.function} ({culprit.file}:{culprit.line})" if culprit.function else ""
            where = f", pid {culprit.pid} @ {culprit.node_ip}" if culprit.pid else ""
            out.print(f"  [red]✗ {title}: {name}{escape(source)}{escape(where)}[/red] "
                      f"{escape(culprit.actor_class or '')} {escape(place)}")
            out.print(f"    [dim]evidence: {escape(culprit.rule or '?')} — {escape(culprit.reason)}[/dim]")
        if verdict.consequences:
            out.print("  [bold]consequences[/bold]")
            for item in verdict.consequences[:12]:
                out.print(f"    [yellow]{escape(item.who)}[/yellow] ({escape(item.state)}): {escape(item.because)}")
            if len(verdict.consequences) > 12:
                out.print(f"    [dim]... and {len(verdict.consequences) - 12} more[/dim]")
        if verdict.next_command:
            out.print(f"[bold]next:[/bold] {escape(verdict.next_command)}")
    elif verdict.state in ("unsure", "unread"):
        out.print(f"[yellow bold]verdict:[/yellow bold] [yellow]{escape(verdict.summary)}[/yellow]")
    else:
        out.print(f"[green]verdict:[/green] {escape(verdict.summary)}")


def frame_lines(frames, limit: int = MAX_FRAMES) -> list[str]:
    """Frames innermost first; runs of library frames folded to their innermost one."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.stacks.analysis import is_library

    lines: list[str] = []
    index = 0
    while index < len(frames) and len(lines) < limit:
        frame = frames[index]
        run = 1
        if is_library(frame):
            while index + run < len(frames) and is_library(frames[index + run]):
                run += 1
        where = f"{escape(frame.short_file or frame.file)}:{frame.line}"
        text = f"    {escape(frame.function)}  [dim]{where}[/dim]"
        if run > 1:
            text += f"  [dim](+{run - 1} library frames)[/dim]"
        lines.append(text)
        index += run
    if index < len(frames):
        lines.append(f"    [dim]... {len(frames) - index} outer frames[/dim]")
    return lines


def _who(group, members) -> str:
    classes = ", ".join(group.actor_classes) if group.actor_classes else ""
    roles = sorted({m.role for m in members if m is not None})
    if group.ranks and len(group.ranks) == group.count:
        noun = "rank" if group.count == 1 else "ranks"
        return f"{group.count} {noun} {group.ranks}" + (f" {classes}" if classes else "")
    noun = classes or "/".join(roles) or "process"
    return f"{group.count} × {noun}"


def _link(link) -> str:
    name = link.task_name or link.role
    who = f"rank {link.rank} " if link.rank is not None else ""
    return f"{name} ({who}pid {link.pid})"


@app.command()
def stacks(
    address: AddressOption = None,
    native: Annotated[bool, typer.Option("--native", help="Add C/C++ frames (py-spy pauses each process briefly).")] = False,
    include_idle: Annotated[bool, typer.Option("--include-idle", help="Also idle pool workers and idle background threads.")] = False,
    rank: RanksOption = None,
    pid: Annotated[list[int] | None, typer.Option("--pid", help="Only these pids (repeatable).")] = None,
    timeout: Annotated[float, duration_option("--timeout", help="Time for the whole capture (both samples and every clue); partial results after that.", check=positive)] = 30.0,
    job: Annotated[str | None, typer.Option("--job", help="Only this Ray job's processes (its id, e.g. 02000000).")] = None,
    once: Annotated[bool, typer.Option("--once", help="One sample only (cannot tell a hung job from a busy one).")] = False,
    interval: Annotated[float, duration_option("--interval", help="Time between the two samples.")] = 2.0,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the report here (.json: JSON, else text).")] = None,
    record: Annotated[bool, typer.Option("--record/--no-record", help="Store the report as stack_report evidence.")] = True,
    json_: JsonOption = False,
) -> None:
    """Every worker's and driver's Python stack, grouped, judged: the root cause and its consequences.

    Exit 0: progress seen (busy) or an idle job (ok); 1: culprit, deadlock or hung; 2: unsure or unread.
    """
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.stacks import dump_stacks, record_report

    if interval < 0 or interval > 300:
        raise UsageError(f"--interval must be between 0 and 300 seconds, got {interval:g}", fix="e.g. --interval 2")
    report = dump_stacks(address, pids=pid or None, native=native, include_idle=include_idle, rank=rank,
                         timeout=timeout, samples=1 if once else 2, interval=interval, job=job)
    if record:
        record_report(report)
        _flush()
    if output is not None:
        _write(report, output)
    unreturned = _unreturned_calls()
    if json_:
        emit_json({**report.to_dict(), "unreturned_calls": unreturned})
    else:
        render_report(report)
        for call in unreturned:
            console.print(f"[yellow]verl: rank {call['rank']} has not returned from {call['method']} "
                          f"({call['seconds']:.0f}s, {call['worker_name'] or 'worker'})[/yellow]")
    finish(report.verdict.exit_code)


def _unreturned_calls() -> list[dict]:
    """Registered-method calls of an instrumented verl worker group that have not returned (if any)."""
    try:
        # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
        from raysleuth.integrations.verl import unreturned_calls

        calls = unreturned_calls()
    except Exception:  # no run, no verl evidence: nothing to add
        return []
    return [{"rank": call.rank, "method": call.method, "worker_name": call.worker_name, "task_id": call.task_id,
             "seconds": round(call.seconds, 1)} for call in calls]


def _write(report, output: Path) -> None:
    import json

    from rich.console import Console

    output = Path(output).expanduser()
    if output.suffix == ".json":
        output.write_text(json.dumps(to_jsonable(report.to_dict()), indent=2, default=repr))
        return
    with output.open("w") as handle:
        render_report(report, out=Console(file=handle, width=120, no_color=True, highlight=False))


def _flush() -> None:
    try:
        # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
        from raysleuth.recorder import get_client

        get_client().flush(timeout=5)
    except Exception:
        pass


@app.command()
def watch(
    address: AddressOption = None,
    stall: Annotated[float, duration_option("--stall", help="Time without step progress that counts as a stall.", check=positive)] = 120.0,
    forever: Annotated[bool, typer.Option("--forever", help="Keep watching after a stall instead of exiting 1.")] = False,
    duration: Annotated[float | None, duration_option("--duration", help="Stop after this long (exit 0 if no stall).", check=positive)] = None,
    interval: Annotated[float | None, duration_option("--interval", help="Time between heartbeat reads.", check=positive)] = None,
    timeout: Annotated[float, duration_option("--timeout", help="Time for the stacks snapshot at a stall.", check=positive)] = 30.0,
    job: Annotated[str | None, typer.Option("--job", help="Only this Ray job's ranks (its id, e.g. 02000000).")] = None,
    slow: Annotated[bool, typer.Option("--slow", help="Also report a straggler once one appears (raysleuth stragglers).")] = False,
    home: HomeOption = None,
    json_: JsonOption = False,
) -> None:
    """Follow rs.heartbeat/rs.step; on a stall take stacks, store them, print the verdict (exit 1)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.stall import Watchdog
    from raysleuth.stragglers import SlowWatch

    connect(address)
    dog = Watchdog(stall, address=address, home=str(home_path(home)), interval=interval, stacks_timeout=timeout,
                   include_self=False, job=job)
    if not json_:
        err_console.print(f"[dim]watching heartbeats (stall {stall:g}s){'; Ctrl-C to stop' if forever else ''}[/dim]")
    started = time.monotonic()
    stalls = 0
    slow_watch = SlowWatch(address, home=str(home_path(home)), job=job) if slow else None
    try:
        while duration is None or time.monotonic() - started < duration:
            if slow_watch is not None and watch_slow(slow_watch, json_) and not forever:
                stalls += 1  # a straggler ends the watch like a stall does (exit 1)
                break
            event = dog.poll()
            if event is None:
                if dog.finished and not forever:
                    break  # the loop finished: nothing more will happen
                time.sleep(dog.interval)
                continue
            stalls += 1
            _flush()
            if json_:
                emit_json(event.to_dict())
            else:
                console.print(f"[red bold]stall:[/red bold] [red]{escape(event.summary)}[/red]")
                if event.report is not None:
                    render_report(event.report)
                else:
                    console.print(f"[yellow]no stacks: {escape(event.error or 'unknown error')}[/yellow]")
            if not forever:
                break
    except KeyboardInterrupt:
        pass
    if stalls == 0 and json_:
        emit_json({"stalls": 0, "ranks": sorted({r.rank for r in dog.tracker.ranks.values()}),
                   "summary": dog.finished or "no stall",
                   "finished": dog.finished is not None})
    elif stalls == 0 and dog.finished:
        console.print(f"[green]no stall[/green]: {escape(dog.finished)}")
    elif stalls == 0:
        console.print(f"[green]no stall[/green] ({len(dog.tracker.ranks)} rank(s) heart-beating)")
    finish(1 if stalls else 0)
