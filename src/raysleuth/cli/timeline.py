"""``raysleuth timeline``: a Chrome/Perfetto trace, or the per-step straggler summary."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from raysleuth.cli._app import (
    AddressOption, HomeOption, JobOption, JsonOption, RanksOption, RunOption, SinceOption, StepsOption, app, console,
    emit_json, finish, home_path, name_run, non_negative,
)
from raysleuth import options
from raysleuth.errors import UsageError
from raysleuth.timeline.summary import STRAGGLER_RATIO, stragglers_of


@app.command()
def timeline(
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the trace JSON here (open at ui.perfetto.dev).")] = None,
    steps: StepsOption = None,
    ranks: RanksOption = None,
    job: JobOption = None,
    since: SinceOption = None,
    until: Annotated[float | None, typer.Option("--until", metavar="WHEN", parser=options.parse_since,
                                                help="Only up to 30s / 10m / 2h ago, or an ISO time.")] = None,
    summary: Annotated[bool, typer.Option("--summary", help="Print per step and phase: duration per rank, slowest rank, lag.")] = False,
    ray_tasks: Annotated[bool, typer.Option("--ray-tasks/--no-ray-tasks", help="Merge Ray's task events (needs the cluster).")] = True,
    every: Annotated[bool, typer.Option("--all", help="With -o: every record, however many (by default a trace over "
                                                      "100,000 records keeps the newest that fit, and says so). With "
                                                      "--summary: every step phase (by default past 40 rows, the 40 "
                                                      "that lag most).")] = False,
    lag_threshold: Annotated[float, typer.Option("--lag", help="With --summary: exit 1 when a rank lags the median by this ratio.", callback=non_negative)] = 0.0,
    address: AddressOption = None,
    run: RunOption = None,
    home: HomeOption = None,
    json_: JsonOption = False,
) -> None:
    """One timeline of the job: Ray tasks + spans + events + memory, one process per node, one thread per rank."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.timeline import TRACE_LIMIT, export_timeline, timeline_summary

    if not summary and output is None:
        raise UsageError("timeline needs -o FILE (the trace to write) or --summary",
                         fix="e.g. raysleuth timeline -o trace.json --steps 10-20")
    code = 0
    result: dict = {}
    run = name_run(run, home)
    if output is not None:
        exported = export_timeline(output, address, run=run, home=home_path(home), steps=steps,
                                   ranks=ranks, jobs=job, ray_tasks=ray_tasks, since=since, until=until,
                                   limit=None if every else TRACE_LIMIT)
        result["timeline"] = exported.to_dict()
        if not json_:
            console.print(f"wrote [bold]{escape(str(exported.path))}[/bold]: {exported.spans} spans, {exported.ray_tasks} Ray tasks, "
                          f"{exported.instant_events} events, {exported.memory_samples} memory samples "
                          f"({exported.written} trace events) — open it at https://ui.perfetto.dev")
            for warning in exported.warnings:
                console.print(f"[yellow]⚠️  {escape(warning)}[/yellow]", soft_wrap=True)
    if summary:
        rows = timeline_summary(run=run, home=home_path(home), steps=steps, ranks=ranks, jobs=job, since=since,
                                until=until)
        result["summary"] = rows
        if lag_threshold and any(row.lag_ratio >= lag_threshold for row in rows):
            code = 1
        if not json_:
            render_summary(rows, limit=None if every else SUMMARY_ROWS)
    if json_:
        emit_json(result)
    finish(code)


#: Rows of ``timeline --summary``'s table past which it shows only those that lag most (``--all``: every row).
SUMMARY_ROWS = 40


def render_summary(rows, limit: int | None = SUMMARY_ROWS) -> None:
    """The straggler table: per step and phase, each rank's time (phase and rank names escaped). Past ``limit``
    rows: how many step phases and stragglers, which ranks were slowest most often, then the ``limit`` rows that
    lag most (by lag ratio, then lag; in step order), and how to see the others."""
    if not rows:
        console.print("no spans with a step recorded (use rs.span(name, step=i) or rs.step(i))")
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("step", "phase", "per rank (s)", "median", "slowest", "lag"):
        table.add_column(column, overflow="fold")
    straggling = {id(row) for row in stragglers_of(rows)}
    shown = rows
    if limit is not None and len(rows) > limit:
        _render_overview(rows, len(straggling))
        kept = sorted(range(len(rows)), key=lambda at: (-rows[at].lag_ratio, -rows[at].lag_s, at))[:limit]
        shown = [rows[at] for at in sorted(kept)]
    for row in shown:
        per_rank = escape(_per_rank(row.durations))
        style = "red" if id(row) in straggling else ""
        lag = f"+{row.lag_s:.3f}s ({row.lag_ratio:.2f}×)"
        slowest = escape(str(row.slowest))
        table.add_row(str(row.step), escape(str(row.phase)), per_rank, f"{row.median_s:.3f}",
                      f"[{style}]{slowest}[/{style}]" if style else slowest,
                      f"[{style}]{lag}[/{style}]" if style else lag)
    console.print(table)
    if shown is not rows:
        console.print(f"[dim]the {len(shown)} of {len(rows):,} step phases that lag most; --all for every one, --steps "
                      f"or --ranks to narrow, --json for every rank's seconds[/dim]")


def _render_overview(rows, stragglers: int) -> None:
    """One line on every step phase of a long summary: how many, the steps, the stragglers, who was slowest."""
    steps = sorted({row.step for row in rows})
    often = Counter(str(row.slowest) for row in rows if len(row.durations) > 1).most_common(3)
    named = ", ".join(f"{escape(who)} in {count:,}" for who, count in often)
    console.print(f"{len(rows):,} step phases, steps {steps[0]}-{steps[-1]}; {stragglers:,} with a straggler "
                  f"(slowest >= {STRAGGLER_RATIO:g}x the median)" + (f"; slowest most often: {named}" if named else ""))


def _per_rank(durations: dict[str, float]) -> str:
    """Every rank's seconds up to 16 ranks; past that the fastest, the three slowest and how many ranks."""
    if len(durations) <= 16:
        return "  ".join(f"{who}:{value:.3f}" for who, value in durations.items())
    ordered = sorted(durations.items(), key=lambda item: item[1])
    slowest = "  ".join(f"{who}:{value:.3f}" for who, value in ordered[-3:])
    return f"{len(ordered)} ranks; fastest {ordered[0][0]}:{ordered[0][1]:.3f}; slowest {slowest}"
