"""``raysleuth explain`` and ``raysleuth advise``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from raysleuth.cli._app import HomeOption, JsonOption, RunOption, app, at_least_one, console, emit_json, finish, home_path
from raysleuth.cli.tasks import print_deaths
from raysleuth.errors import UsageError


def _read_input(text: str | None, file: Path | None) -> str:
    if file is not None:
        if str(file) == "-":
            return sys.stdin.read()
        try:
            return Path(file).expanduser().read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            raise UsageError(f"cannot read {file}: {error.strerror or error}",
                             fix="pass a readable log file, or the text itself") from None
    if text == "-" or (text is None and not sys.stdin.isatty()):
        return sys.stdin.read()
    if text is None:
        raise UsageError("nothing to explain", fix='pass the error text, --file LOG, or "-" to read stdin')
    return text


@app.command()
def explain(
    text: Annotated[str | None, typer.Argument(help='Error text, or "-" for stdin.')] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Read a log file (or - for stdin).")] = None,
    run: RunOption = None,
    home: HomeOption = None,
    json_: JsonOption = False,
) -> None:
    """What an error means: the known causes found in TEXT, root cause first, with the fix (exit 1 if none).

    When the run's evidence has a classified death of a worker TEXT names (actor id or pid), its rank and
    cause come first."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.deaths import deaths_named_in
    from raysleuth.explain import explain as run_explain

    content = _read_input(text, file)
    matches = run_explain(content)
    deaths = deaths_named_in(content, run, home=home_path(home) if home else None)
    if json_:
        emit_json({"verdict": "explained" if matches or deaths else "no known cause",
                   "deaths": [death.to_dict() for death in deaths],
                   "matches": [match.to_dict() for match in matches]})
        finish(0 if matches or deaths else 1)
    if deaths:
        print_deaths(deaths, lines=2)
        console.print()
    if not matches and deaths:
        finish(0)
    if not matches:
        console.print("[yellow]no known cause[/yellow] for this text; try `raysleuth crashes` or "
                      "`raysleuth advise --problem crash`")
        finish(1)
    render_matches(matches)
    finish(0)


def render_matches(matches) -> None:
    """Each known cause found in a text, root cause first (the evidence is the user's text: escaped)."""
    for number, match in enumerate(matches):
        label = "[bold red]root cause[/bold red]" if number == 0 else "[dim]also seen[/dim]"
        console.print(f"{label}: [bold]{escape(match.title)}[/bold]  [dim]({escape(match.id)})[/dim]", soft_wrap=True)
        console.print(f"  evidence (line {match.line}): {match.evidence}", markup=False, soft_wrap=True)
        console.print(f"  cause: {escape(match.cause)}", soft_wrap=True)
        console.print(f"  [green]fix: {escape(match.fix)}[/green]", soft_wrap=True)
        if match.docs:
            console.print(f"  docs: {match.docs}", markup=False, soft_wrap=True)
        console.print()


@app.command()
def advise(
    problem: Annotated[str, typer.Option("--problem", "-p",
                                         help="hang | divergence | memory | crash | scheduling | slow")],
    nodes: Annotated[int | None, typer.Option("--nodes", help="Number of nodes in the cluster.", callback=at_least_one)] = None,
    reproducible: Annotated[bool | None, typer.Option("--reproducible/--not-reproducible",
                                                      help="Does the problem happen again on demand?")] = None,
    cause: Annotated[list[str] | None, typer.Option("--cause", help="A worker's classified death cause "
                                                    "(from `raysleuth tasks --dead`); repeat for several.")] = None,
    from_run: Annotated[bool, typer.Option("--from-run", help="Use the causes of the deaths recorded in the run.")] = False,
    run: RunOption = None,
    home: HomeOption = None,
    json_: JsonOption = False,
) -> None:
    """What to run, in order, for a kind of problem: the debugging decision tree (branching on a death's cause)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.advise import advise as run_advise

    causes = list(cause or [])
    if from_run:
        # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
        from raysleuth.deaths import stored_deaths

        causes += [death.cause for death in stored_deaths(run, home=home_path(home))]
    advice = run_advise(problem, nodes=nodes, reproducible=reproducible, cause=list(dict.fromkeys(causes)))
    if json_:
        emit_json(advice.to_dict())
        finish(0)
    console.print(f"[bold]{escape(advice.problem)}[/bold]: {escape(advice.summary)}"
                  + (f" [dim](death cause: {escape(', '.join(advice.causes))})[/dim]" if advice.causes else "") + "\n",
                  soft_wrap=True)
    for step in advice.steps:
        prefix = {"cli": "$", "code": ">>>", "env": "export"}.get(step.kind, "")
        console.print(f"{step.order}. [bold cyan]{escape(prefix + ' ' + step.run)}[/bold cyan]", soft_wrap=True)
        console.print(f"   {escape(step.why)}", soft_wrap=True)
    finish(0)
