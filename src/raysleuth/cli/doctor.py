"""``raysleuth doctor``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from raysleuth.cli._app import STATUS_STYLE, AddressOption, JsonOption, app, console, duration_option, emit_json, finish
from raysleuth.cli._app import positive  # option checks


@app.command()
def doctor(
    address: AddressOption = None,
    check_debug: Annotated[bool, typer.Option("--check-debug", help="Debug variables, breakpoint hooks, debug ports.")] = False,
    check_ports: Annotated[bool, typer.Option("--check-ports", help="GCS/dashboard ports, what they bind to.")] = False,
    full: Annotated[bool, typer.Option("--full", help="Every check.")] = False,
    ray: Annotated[bool, typer.Option("--ray/--no-ray", help="Check the cluster (nodes, versions, py-spy per node).")] = True,
    timeout: Annotated[float, duration_option("--timeout", help="How long to wait for each node's agent.", check=positive)] = 30.0,
    json_: JsonOption = False,
) -> None:
    """Check this machine and the cluster: versions, py-spy, ports, security, debug setup."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.doctor import run_doctor

    report = run_doctor(address, check_debug=check_debug, check_ports=check_ports, full=full, ray=ray, timeout=timeout)
    if json_:
        emit_json(report.to_dict())
    else:
        render_doctor(report)
    finish(0 if report.ok else 1)


def render_doctor(report) -> None:
    """Draw a :class:`~raysleuth.doctor.DoctorReport` (details, fixes and node names escaped)."""
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("", "check", "node", "detail / fix"):
        table.add_column(column, overflow="fold")
    for check in report.checks:
        icon, style = STATUS_STYLE[check.status]
        text = escape(check.detail or "")
        if check.fix:
            text += f"\n[{style}]→ {escape(check.fix)}[/{style}]"
        table.add_row(icon, f"[{style}]{escape(check.name)}[/{style}]", escape(check.node or ""), text)
    console.print(table)
    counts = report.counts()
    verdict = "[green]all good[/green]" if report.ok else "[red]problems found[/red]"
    console.print(f"\n{verdict}: {counts['ok']} ok, {counts['warn']} warnings, {counts['fail']} failed "
                  f"({report.seconds:.1f}s)")
