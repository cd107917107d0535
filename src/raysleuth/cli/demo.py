"""``raysleuth demo``: a real training job with injected faults, each diagnosed by raysleuth."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from raysleuth import runtime
from raysleuth.cli._app import HomeOption, JsonOption, app, console, emit_json, err_console, finish


@app.command()
def demo(
    scenario: Annotated[list[str] | None, typer.Option(
        "--scenario", "-s", help="Run only this scenario (repeatable): healthy, hang, diverge, leak, crash, pending.")] = None,
    address: Annotated[str | None, typer.Option(
        "--address", help="Run on this Ray cluster (ip:port); default: start an embedded local Ray.")] = None,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="Where to write the HTML report (default: next to the run's evidence).")] = None,
    home: HomeOption = None,
    json_: JsonOption = False,
) -> None:
    """Start Ray, train a small GRPO job under injected faults, and let raysleuth find each culprit."""

    if home is not None:
        os.environ["RAYSLEUTH_HOME"] = str(Path(home).expanduser())  # workers inherit it
        runtime.reload_settings()
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.demo import run_demo

    progress_console = err_console if json_ else console

    def say(message: str) -> None:
        progress_console.print(f"[dim]•[/dim] {escape(message)}", soft_wrap=True)

    with progress_console.status("running the demo...", spinner="dots") if not json_ else _null():
        result = run_demo(scenario or None, address=address, report_path=output, progress=say)
    if json_:
        emit_json(result.to_dict())
        finish(0 if result.ok else 1)
    render_demo(result)
    finish(0 if result.ok else 1)


def render_demo(result) -> None:
    """Each scenario: what was injected, what found it, the verdict (verdicts quote the job: escaped)."""
    console.print()
    for item in result.results:
        mark = "[green]✔[/green]" if item.correct else "[red]✘[/red]"
        console.print(f"{mark} [bold]{escape(item.scenario)}[/bold] ({item.seconds:.0f}s): injected "
                      f"{escape(item.injected)}", soft_wrap=True)
        console.print(f"    found by [cyan]{escape(item.found_by)}[/cyan]: {escape(item.verdict)}", soft_wrap=True)
    table = Table(title="raysleuth demo", show_lines=False, header_style="bold")
    for column in ("scenario", "injected", "found by", "verdict", "correct?"):
        table.add_column(column, overflow="fold")
    for item in result.results:
        table.add_row(escape(item.scenario), escape(item.injected), escape(item.found_by), escape(item.verdict),
                      "[green]yes[/green]" if item.correct else "[red]no[/red]")
    console.print()
    console.print(table)
    if result.report_path:
        console.print(f"report: {escape(str(result.report_path))}", soft_wrap=True)
    if result.trace_path:
        console.print(f"trace:  {escape(str(result.trace_path))}", soft_wrap=True)
    if result.report_error:
        console.print(f"[yellow]{escape(str(result.report_error))}[/yellow]", soft_wrap=True)
    verdict = "[green]every scenario diagnosed correctly[/green]" if result.ok else "[red]some scenarios were not diagnosed correctly[/red]"
    console.print(f"{verdict} ({result.seconds:.0f}s, run {escape(str(result.run_id))})")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
