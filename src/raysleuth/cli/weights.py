"""``raysleuth weights``: did the rollout engine get the trainer's weights? One line per sync, drift beside it."""

from __future__ import annotations

from rich.markup import escape

from raysleuth.cli._app import (
    HomeOption, JobOption, JsonOption, RunOption, StepsOption, app, console, emit_json, finish, home_path, name_run,
)
from raysleuth.errors import UsageError

_STYLE = {"intact": "green", "stale": "red", "differs": "red", "unreceived": "red", "unsent": "yellow",
          "incomplete": "yellow"}


def _ranges(versions: list[int]) -> str:
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.logs.aggregate import format_ranks

    return format_ranks(versions) or "none"


def _line(sync, gap) -> str:
    style = _STYLE.get(sync.status, "yellow")
    received = "/".join(str(n) for n in sync.received) or "0"
    parts = [f"step {sync.version}: [{style}]{sync.status}[/{style}]", f"sent {sync.sent}", f"received {received}"]
    if gap is not None:
        mark = " [red]jump[/red]" if gap.jump else ""
        parts.append(f"logprob gap {gap.mean_abs:.4g} (max {gap.max_abs:.4g}){mark}")
    if sync.loaded:
        good = sum(1 for item in sync.loaded if item["intact"])
        parts.append(f"loaded {good}/{len(sync.loaded)} shard(s) intact")
    if sync.casts:
        parts.append(f"{len(sync.casts)} equal after a float cast")
    return ", ".join(parts)


def _details(sync) -> list[str]:
    lines = []
    if sync.stale:
        lines.append("[red]stale[/red]: the rollout side equals the previous version, so this sync did nothing")
    if sync.missing:
        lines.append(f"missing ({len(sync.missing)}): {escape(', '.join(sync.missing[:5]))}"
                     + (" ..." if len(sync.missing) > 5 else ""))
    if sync.extra:
        lines.append(f"extra ({len(sync.extra)}): {escape(', '.join(sync.extra[:5]))}"
                     + (" ..." if len(sync.extra) > 5 else ""))
    mismatched = [d for d in sync.diffs if d.kind in ("dtype", "shape") and d.stage == "transit"]
    for diff in mismatched[:5]:
        lines.append(f"{diff.kind} mismatch: {escape(diff.describe())}")
    transit = [d for d in sync.diffs if d.stage == "transit" and d.kind not in ("missing", "extra", "dtype", "shape")]
    if transit:
        more = f" (+{len(transit) - 1} more)" if len(transit) > 1 else ""
        lines.append(f"first differing tensor: {escape(transit[0].describe())}{more}")
    load = [d for d in sync.diffs if d.stage == "load"]
    if load:
        more = f" (+{len(load) - 1} more)" if len(load) > 1 else ""
        lines.append(f"loaded wrong: {escape(load[0].describe())}{more}")
    lines.extend(escape(note) for note in sync.notes)
    return lines


@app.command()
def weights(
    steps: StepsOption = None,
    run: RunOption = None,
    home: HomeOption = None,
    job: JobOption = None,
    json_: JsonOption = False,
) -> None:
    """Check every recorded weight sync (trainer -> rollout) and the logprob gap beside it; exit 1 on any difference."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.weights import HOW_TO_RECORD, weights_report

    path = name_run(run, home)
    report = weights_report(path, home=home_path(home), jobs=job)
    if steps is not None:
        kept = weights_report(path, home=home_path(home), jobs=job, steps=steps)
        if not kept.syncs:
            raise UsageError(f"no weight sync recorded at step {_show(steps)}",
                             fix=f"steps with a sync: {_ranges([s.version for s in report.syncs])}")
        report = kept
    if not report.syncs:
        message = f"no weight syncs recorded in this run: {HOW_TO_RECORD}"
        if json_:
            emit_json(dict(report.to_dict(), message=message))
        else:
            console.print(f"[yellow]{escape(message)}[/yellow]", soft_wrap=True)
        finish(2)
    if json_:
        emit_json(report.to_dict())
        finish(1 if report.problem else 0)
    for sync in report.syncs:
        console.print(_line(sync, report.gap_at(sync.version)), soft_wrap=True)
        for line in _details(sync):
            console.print(f"    {line}", soft_wrap=True)
    for jump in report.jumps:
        console.print(f"[red]logprob gap jump at step {jump['step']}[/red]: {jump['mean_abs']:.4g}, run median "
                      f"{jump['median']:.4g}; {escape(jump['verdict'])}", soft_wrap=True)
    bad = [s.version for s in report.syncs if not s.intact]
    summary = (f"[red]{len(bad)} of {len(report.syncs)} syncs not intact[/red] (steps {_ranges(bad)})" if bad
               else f"[green]all {len(report.syncs)} syncs intact[/green]")
    console.print(summary)
    finish(1 if report.problem else 0)


def _show(steps) -> str:
    low, high = steps
    if low == high:
        return str(low)
    return f"{'' if low is None else low}-{'' if high is None else high}"

