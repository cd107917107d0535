"""``raysleuth report``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from raysleuth.cli._app import HomeOption, JsonOption, RunOption, app, console, emit_json, finish, home_path, name_run


@app.command()
def report(
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write (a folder: report.html "
                                                                "in it; the folder must exist).")] = Path("report.html"),
    run: RunOption = None,
    home: HomeOption = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="A Perfetto trace to link (default: trace.json next to the report).")] = None,
    json_: JsonOption = False,
) -> None:
    """Write one self-contained HTML report of a run (opens offline; no cluster needed)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.recorder.reading import one_shot
    from raysleuth.report import generate_report

    one_shot()  # this process answers once and exits: what the read keeps alive is frozen, not walked again

    result = generate_report(output, run=name_run(run, home), home=home_path(home), trace_path=trace)
    if json_:
        emit_json(result.to_dict())
    else:
        shown = ", ".join(f"{name} {count}" for name, count in result.sections.items())
        console.print(f"[green]report written[/green]: {result.path} ({result.bytes / 2**20:.1f} MiB, run {result.run_id})")
        console.print(f"[dim]{shown}[/dim]")
        if result.trace_path:
            console.print(f"[dim]linked trace: {result.trace_path}[/dim]")
    finish(0)
