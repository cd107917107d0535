"""``raysleuth consistency``: the stored consistency checks and their verdicts."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from raysleuth.cli._app import (
    HomeOption, JobOption, JsonOption, RunOption, app, at_least_one, console, emit_json, finish, home_path, name_run,
)


@app.command()
def consistency(
    run: RunOption = None,
    home: HomeOption = None,
    key: Annotated[str | None, typer.Option("--key", help="Only checks with this key (e.g. params, gradients).")] = None,
    job: JobOption = None,
    limit: Annotated[int, typer.Option("--limit", help="How many checks to list, newest first.", callback=at_least_one)] = 20,
    json_: JsonOption = False,
) -> None:
    """List stored consistency checks (which tensor, which rank, which element); exit 1 unless the latest was consistent.

    The latest check mismatched, could not run, or compared nothing (0 tensors on every rank): exit 1.
    """
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.consistency import latest_checks

    checks = latest_checks(name_run(run, home), home=home_path(home), key=key, limit=limit, jobs=job)
    latest_bad = bool(checks) and not checks[0][1].consistent
    if json_:
        emit_json({"checks": [dict(report.to_dict(), time=rec.time, recorded_by_rank=rec.rank)
                              for rec, report in checks],
                   "latest_consistent": (checks[0][1].consistent if checks else None)})
        finish(1 if latest_bad else 0)
    if not checks:
        console.print("no consistency checks recorded" + (f" with key {escape(repr(key))}" if key else "")
                      + " (call rs.check_distributed_consistency(...) on every rank)")
        finish(0)
    render_checks(checks)
    finish(1 if latest_bad else 0)


def render_checks(checks) -> None:
    """The stored checks, newest first, and the latest one's mismatches (keys, values and notes escaped)."""
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("time", "key", "step", "ranks", "verdict", "culprits"):
        table.add_column(column, overflow="fold")
    for rec, report in checks:
        when = time.strftime("%H:%M:%S", time.localtime(rec.time))
        if report.consistent:
            verdict = f"[green]consistent[/green] ({report.tensors_checked} tensors)"
        elif report.error:
            verdict = "[yellow]could not run[/yellow]"
        elif report.nothing_compared:
            verdict = "[yellow]nothing compared[/yellow] (0 tensors)"
        else:
            verdict = f"[red]{len(report.mismatches)} mismatched[/red]"
            if report.missing_ranks:
                verdict += f", [red]ranks {report.missing_ranks} missing[/red]"
        culprits = ", ".join(str(rank) for rank in report.outlier_ranks) or "-"
        table.add_row(when, escape(str(report.key)), "-" if report.step is None else str(report.step),
                      f"{len(report.arrived_ranks) or report.world_size}/{report.world_size}", verdict, culprits)
    console.print(table)
    latest = checks[0][1]
    if not latest.consistent:
        console.print(f"\n[bold]latest check {escape(repr(latest.key))}[/bold]:")
        for mismatch in latest.mismatches[:20]:
            console.print(f"  [red]✗[/red] {escape(mismatch.describe())}", soft_wrap=True)
            if mismatch.values:
                shown = ", ".join(f"rank {rank}: {value}" for rank, value in mismatch.values.items())
                console.print(f"      values at that index: {escape(shown)}", soft_wrap=True)
        if len(latest.mismatches) > 20:
            console.print(f"  ... {len(latest.mismatches) - 20} more (use --json)")
        if latest.missing_ranks:
            console.print(f"  [red]✗[/red] rank(s) {latest.missing_ranks} did not arrive within {latest.timeout}s")
        if latest.error:
            console.print(f"  [yellow]⚠️ [/yellow] {escape(str(latest.error))}", soft_wrap=True)
        if latest.nothing_compared:
            console.print(f"  [yellow]⚠️ [/yellow] {escape(latest.summary())}", soft_wrap=True)
        for note in latest.notes:
            console.print(f"  note: {escape(str(note))}", soft_wrap=True)
