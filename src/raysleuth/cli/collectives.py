"""``raysleuth collectives``: every rank's last collectives aligned, and who broke the sequence."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from raysleuth import cluster
from raysleuth.cli._app import (
    AddressOption, HomeOption, JsonOption, RunOption, app, console, duration_option, emit_json, finish, home_path,
    name_run,
)
from raysleuth.errors import UsageError
from raysleuth.options import format_ranks

_STATE_STYLE = {"completed": "", "pending": "yellow", "error": "red"}


@app.command("collectives")
def collectives(
    pg: Annotated[str | None, typer.Option("--pg", help="Only this process group (its name or description).")] = None,
    last: Annotated[int, typer.Option("--last", help="Collectives per rank to show.")] = 8,
    wait: Annotated[float, duration_option("--wait", help="How long to wait for live workers to dump.")] = 4.0,
    pending_after: Annotated[float, duration_option("--pending-after",
                                                    help="Time in one collective that counts as waiting.")] = 5.0,
    job: Annotated[str | None, typer.Option("--job", help="Ray job id (default: the newest job that recorded).")] = None,
    address: AddressOption = None,
    run: RunOption = None,
    home: HomeOption = None,
    json_: JsonOption = False,
) -> None:
    """Which rank broke the collective sequence (exit 1 when one did).

    Live: asks every instrumented worker for a dump, then aligns ranks by
    sequence number per process group. With --run: reads a stored run (works
    after the cluster is gone).
    """
    if last < 1 or wait < 0 or pending_after <= 0:
        raise UsageError("--last must be >= 1, --wait >= 0 and --pending-after > 0",
                         fix="e.g. raysleuth collectives --last 8 --wait 4")
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.collectives import collect_collectives
    from raysleuth.recorder.reading import one_shot

    one_shot()  # this process answers once and exits: what the read keeps alive is frozen, not walked again

    run = _stored_run_without_cluster(run, address, home)
    report = collect_collectives(address, run=run, home=home_path(home) if (home or run) else None, wait=wait,
                                 job=job, group=pg, last=last, pending_after=pending_after)
    code = report.exit_code
    if pg is not None and not report.verdict.groups and report.groups_seen:
        raise UsageError(f"no process group {pg!r} in this run's collectives",
                         fix=f"pick one of: {', '.join(report.groups_seen)}")
    if json_:
        emit_json(report.to_dict())
        finish(code)
    render_collectives(report)
    finish(code)


def render_collectives(report) -> None:
    """Notes, each group's aligned sequence, then the culprit or the summary (calls and notes escaped)."""
    for note in report.notes:
        console.print(f"[yellow]{escape(note)}[/yellow]", soft_wrap=True)
    for group in report.verdict.groups:
        _draw_group(group)
    if report.culprits:
        console.print("[bold red]culprit[/bold red]")
        for culprit in report.culprits:
            console.print(f"  [red]rank {culprit.rank}[/red] ({escape(str(culprit.kind))}): {escape(culprit.reason)}",
                          soft_wrap=True)
    elif report.missing:  # nothing (or not everything) to compare: never "sequences agree"
        console.print("[yellow]not enough data to compare the collective sequences:[/yellow]")
        for line in report.missing:
            console.print(f"  [yellow]{escape(line)}[/yellow]", soft_wrap=True)
    elif report.unanswered:
        # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
        from raysleuth.collectives.report import unanswered_text

        console.print(f"[yellow]{escape(unanswered_text(report.unanswered))}[/yellow]", soft_wrap=True)
    else:
        console.print(f"[green]{escape(report.verdict.summary)}[/green]")


def _stored_run_without_cluster(run: str | None, address: str | None, home) -> str | None:
    """No --run and no cluster to ask: the newest stored run (as crashes, logs and consistency read)."""
    if run is not None or address is not None:
        return run

    if cluster.choose(None).address is not None:
        return run
    return name_run(None, home)


def _cell(row, rank) -> str:
    cell = row["ranks"].get(rank) if isinstance(row["ranks"], dict) else None
    if cell is None:
        return "[dim]—[/dim]"
    style = _STATE_STYLE.get(cell["state"], "")
    text = escape(cell["call"]) + (f" [dim]{escape(cell['where'])}[/dim]" if cell.get("where") else "")
    if cell["state"] != "completed":
        text += f" ({escape(str(cell['state']))})"
    return f"[{style}]{text}[/{style}]" if style else text


def _draw_group(group) -> None:
    table = Table(title=escape(f"{group.label} (group {group.name}, ranks {format_ranks(group.ranks)})"),
                  show_header=True, header_style="bold", box=None, pad_edge=False, title_justify="left")
    table.add_column("#", justify="right")
    columns = group.headed_columns()  # one per rank up to 8 ranks, else ranks whose rows read alike share one
    for header, _rank in columns:
        table.add_column(header, overflow="fold")
    for row in group.rows:
        table.add_row(str(row["seq"]), *(_cell(row, rank) for _header, rank in columns))
    console.print(table)
