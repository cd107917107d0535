"""``raysleuth stragglers``: which rank is slow, by how much, what it costs its peers, and where (issue 26).

Exit codes: 1 a straggler is named; 0 the ranks are even (seen over enough
collectives); 2 not enough to judge (no collectives recorded, or fewer than
``--min-collectives`` in the window: the output says what is missing), or
bad input.
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from raysleuth.cli._app import (
    AddressOption, HomeOption, JsonOption, RanksOption, RunOption, app, at_least_one, console, duration_option,
    emit_json, finish, home_path, non_negative, positive,
)
from raysleuth.errors import UsageError
from raysleuth.stragglers.analysis import MIN_COLLECTIVES, MIN_SHARE, THRESHOLD
from raysleuth.stragglers.phase import where
from raysleuth.stragglers.sampling import RATE, SECONDS

_STATE_STYLE = {"straggler": "red", "even": "green", "unread": "yellow"}


@app.command("stragglers")
def stragglers(
    window: Annotated[float, duration_option("--window", help="Judge the collectives of the last DURATION.",
                                             check=positive)] = 30.0,
    ranks: RanksOption = None,
    job: Annotated[str | None, typer.Option("--job", help="Ray job id (default: the newest job that recorded).")] = None,
    threshold: Annotated[float, typer.Option(
        "--threshold", help="Lateness, as a share of the step, that counts as late (0.10: 10%).",
        callback=positive)] = THRESHOLD,
    min_collectives: Annotated[int, typer.Option(
        "--min-collectives", help="Fewest collectives to judge.", callback=at_least_one)] = MIN_COLLECTIVES,
    min_share: Annotated[float, typer.Option(
        "--min-share", help="Share of the collectives a rank must be late in to be named.",
        callback=positive)] = MIN_SHARE,
    sample: Annotated[float, duration_option("--sample", help="How long one round samples the straggler's stacks "
                                             "(more rounds while its slow phase is unclear; 0: don't).",
                                             check=non_negative)] = SECONDS,
    rate: Annotated[int, typer.Option("--rate", help="Stack samples per second.", callback=at_least_one)] = RATE,
    wait: Annotated[float, duration_option("--wait", help="How long to wait for live workers to dump.",
                                           check=non_negative)] = 4.0,
    address: AddressOption = None,
    run: RunOption = None,
    home: HomeOption = None,
    json_: JsonOption = False,
) -> None:
    """Which rank is slow: the rank that enters collectives last, consistently (exit 1 when one is named).

    Live: asks every instrumented worker for its collectives (no code change:
    run the job under `raysleuth run`), judges the last --window, then samples
    the straggler and two peers with py-spy to name its slow phase. With
    --run: a stored run (the window before its newest dump).
    """
    if min_share > 1 or threshold >= 100:
        raise UsageError(f"--min-share must be in (0, 1] (got {min_share:g}) and --threshold a share of the step "
                         f"(got {threshold:g})", fix="e.g. --threshold 0.1 --min-share 0.6")
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.stragglers.collect import Options, collect_stragglers

    options = Options(window=window, ranks=ranks, threshold=threshold, min_collectives=int(min_collectives),
                      min_share=min_share, sample=sample, rate=int(rate), wait=wait)
    shown = console.is_terminal and not json_  # a spinner on a terminal; nothing in a pipe or with --json
    with console.status("reading the ranks' collectives...") if shown else contextlib.nullcontext() as status:
        if status is not None:
            options.progress = status.update
        report = collect_stragglers(address, run=run, home=home_path(home) if (home or run) else None, job=job,
                                    options=options)
    if json_:
        emit_json(report.to_dict())
        finish(report.exit_code)
    render_stragglers(report)
    finish(report.exit_code)


def render_stragglers(report: Any) -> None:
    """Draw a :class:`~raysleuth.stragglers.analysis.StragglerReport`."""
    job_part = f"job {report.job_id}, " if report.job_id else ""
    console.print(f"[dim]{job_part}{report.collectives} collectives over {report.window_s:g}s"
                  f"{f' from the {report.source}' if report.source else ''}"
                  f"{f', step {report.step_s * 1000:.0f} ms' if report.step_s else ''}[/dim]")
    if report.ranks:
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for column in ("rank", "collectives", "median late", "max late", "late in", "last in", "of step", "step"):
            table.add_column(column, justify="right")
        named = {s.rank for s in report.stragglers}
        for t in report.ranks:
            style = "red" if t.rank in named else ""
            table.add_row(f"[{style}]{t.rank}[/{style}]" if style else str(t.rank), str(t.collectives),
                          f"{t.median_lateness_s * 1000:.1f} ms", f"{t.max_lateness_s * 1000:.0f} ms",
                          f"{t.late_share:.0%}", f"{t.last_share:.0%}",
                          f"{t.share_of_step:.0%}" if t.share_of_step is not None else "—",
                          f"{t.step_s * 1000:.0f} ms ({t.step_source})" if t.step_s else "—")
        console.print(table)
    style = _STATE_STYLE.get(report.state, "")
    console.print(f"[bold {style}]{report.state}[/bold {style}]: {escape(report.summary)}")
    for straggler in report.stragglers:
        _draw_phase(straggler)
    named = {s.rank for s in report.stragglers}
    for rank, phase in ((report.sampling or {}).get("phases") or {}).items():
        if phase and phase.get("clear", True) and int(rank) not in named:  # a rank asked for with --rank, not named
            console.print(f"  rank {rank} (asked for, not a straggler) spends {phase['share']:.0%} of its samples in "
                          f"{escape(phase['function'])} ({escape(where(phase['file'], phase['line']))}), "
                          f"its peers {phase['peer_share']:.0%}")
    for line in report.missing:
        console.print(f"[yellow]missing: {escape(line)}[/yellow]")
    for note in report.notes:
        console.print(f"[dim]{escape(note)}[/dim]")
    if report.next_command and not any(s.phase for s in report.stragglers):
        console.print(f"[dim]next: {escape(report.next_command)}[/dim]")


def _draw_phase(straggler: Any) -> None:
    phase = straggler.phase
    if straggler.wait_site:
        console.print(f"  peers wait in [bold]{escape(straggler.wait_site)}[/bold]")
    if phase is None:
        return
    console.print(f"  rank {straggler.rank} is slow in [bold red]{escape(phase.function)}[/bold red] "
                  f"({escape(phase.where)}): {phase.share:.0%} of its samples, {phase.peer_share:.0%} of its peers'")
    wait = phase.peers_wait
    if wait:
        console.print(f"  while its peers wait in {escape(wait['function'])} "
                      f"({escape(where(wait['file'], wait['line']))}): {wait['share']:.0%} of theirs")
    for frame in phase.stack[-4:]:
        console.print(f"    [dim]{escape(frame)}[/dim]")


def watch_slow(watcher: Any, json_: bool) -> bool:
    """``raysleuth watch --slow``: one due check; prints a new straggler (recorded by the watcher). True if one."""
    report = watcher.tick()
    if report is None:
        return False
    if json_:
        emit_json({"straggler": report.to_dict()})
    else:
        console.print("[red bold]straggler:[/red bold]")
        render_stragglers(report)
    return True
