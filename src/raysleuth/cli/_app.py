"""The typer app, shared options, and rendering helpers for every command."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from raysleuth import cluster, options, runtime
from raysleuth.cluster import AddressChoice
from raysleuth.cluster.connection import on_connect
from raysleuth.errors import UsageError

app = typer.Typer(
    name="raysleuth",
    help="Find the culprit when distributed training on Ray goes wrong.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)



@app.callback()
def _root() -> None:
    """Find the culprit when distributed training on Ray goes wrong.

    Every command takes --json; exit codes: 0 all good, 1 problem found, 2 usage or connection error.
    """


#: Width of tables written to a file or a pipe (no terminal to fit): wide enough that no cell wraps.
PIPE_WIDTH = 4096


class _Console(Console):
    """A rich console that, when stdout is not a terminal (a file, ``less``, ``grep``), does not wrap at 80."""

    @property  # type: ignore[misc]  # rich's size is read-write; this console only reads it
    def size(self):
        size = super().size
        if not self.is_terminal and self._width is None and not os.environ.get("COLUMNS"):
            return size._replace(width=PIPE_WIDTH)
        return size

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """Print; a renderer that forgot to escape foreign text prints it plain instead of crashing."""
        from rich.errors import MarkupError

        try:
            super().print(*objects, **kwargs)
        except MarkupError:
            super().print(*objects, **{**kwargs, "markup": False})


console = _Console(highlight=False)
err_console = _Console(stderr=True, highlight=False)

AddressOption = Annotated[
    str | None,
    typer.Option("--address", help="Ray cluster address (ip:port or 'auto'); default: RAY_ADDRESS, else auto."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
RunOption = Annotated[str | None, typer.Option("--run", help="Run id or path to an evidence.sqlite (default: latest).")]
JobOption = Annotated[list[str] | None, typer.Option("--job", help="Only records of this Ray job id, e.g. 02000000 (repeat for several).")]
HomeOption = Annotated[Path | None, typer.Option("--home", help="raysleuth home (default: RAYSLEUTH_HOME or ~/.raysleuth).")]

def _number_check(low: float, *, strict: bool):
    def check(value: float | None) -> float | None:
        if value is None:
            return value
        if value != value or value in (float("inf"), float("-inf")) or value < low or (strict and value == low):
            raise typer.BadParameter(f"{value} must be a finite number {'>' if strict else '>='} {low:g}")
        if value >= 2**53:
            raise typer.BadParameter(f"{value} is too large")
        return value
    return check


#: ``typer.Option(callback=...)`` checks: seconds must be finite and positive; counts at least 1.
positive = _number_check(0, strict=True)
non_negative = _number_check(0, strict=False)
at_least_one = _number_check(1, strict=False)

# ------------------------------------------------------------- ranks, steps, durations, moments
# The shared spellings of every command (issue 13); the parsing itself lives in raysleuth.options.


#: ``--rank 3 --rank 0,1 --ranks 4-7``: one sorted ``list[int]`` (``None``: every rank).
RanksOption = Annotated[list[int] | None, typer.Option(
    "--rank", "--ranks", metavar="RANKS", parser=options.parse_ranks, callback=options.merge_ranks,
    help="Only these ranks: --rank 3 (repeatable), --rank 0,1 or --ranks 4-7.")]
#: ``--step 10-20`` / ``--steps 10`` / ``10-`` / ``-20``: a :class:`~raysleuth.options.StepRange` (``None``: all).
StepsOption = Annotated[options.StepRange | None, typer.Option(
    "--step", "--steps", metavar="STEPS", parser=options.parse_steps, help="Only steps 10-20 (or 10, 10-, -20).")]
#: ``--since 10m`` / ``2h`` / an ISO time: a Unix time (``None``: from the start).
SinceOption = Annotated[float | None, typer.Option(
    "--since", metavar="WHEN", parser=options.parse_since, help="Only the last 30s / 10m / 2h / 1d, or since an ISO time.")]


def duration_option(*names: str, help: str, check: Any = None) -> Any:
    """A seconds option that takes ``1.5``, ``500ms``, ``30s``, ``5m``, ``2h`` or ``1d``; ``check`` bounds it.

    Use as ``Annotated[float, duration_option("--wait", help=..., check=positive)] = 4.0``.
    """
    def seconds(text: str | float | None) -> float | None:
        return None if text is None else options.parse_duration(text, option=names[0])

    return typer.Option(*names, metavar="DURATION", help=help, parser=seconds, callback=check)


def writer_timeout() -> float:
    """Seconds a command waits for the evidence writer (``RAYSLEUTH_WRITER_TIMEOUT``, default 15)."""
    try:
        value = float(os.environ.get("RAYSLEUTH_WRITER_TIMEOUT", "15"))
    except ValueError:
        return 15.0
    return value if 0 < value < 3600 else 15.0


STATUS_STYLE = {"ok": ("✅", "green"), "warn": ("⚠️ ", "yellow"), "fail": ("❌", "red"), "skip": ("➖", "dim")}


def to_jsonable(value: Any) -> Any:
    """Dataclasses, paths and sets to plain JSON types."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def emit_json(value: Any) -> None:
    """Print ``value`` as JSON on stdout (no colours, no wrapping)."""
    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, default=repr) + "\n")
    sys.stdout.flush()


def finish(code: int) -> None:
    """End the command with ``code`` (0 all good, 1 problem found)."""
    raise typer.Exit(code)


def home_path(home: Path | None) -> Path:
    """The raysleuth home to use: ``--home``, else the settings."""
    return Path(home).expanduser() if home else runtime.settings().home


def name_run(run: str | None, home: Path | None) -> str:
    """Resolve the run a command shows and name it in one line on stderr; returns its database path.

    Never falls back silently: a connected cluster without evidence is an
    error naming its run (see ``recorder.choose_run``).
    """
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.recorder import choose_run

    run = _checked_run(run, home_path(home))
    choice = choose_run(run, home=home_path(home))
    err_console.print(f"[dim]{choice.describe()}[/dim]", soft_wrap=True)
    return str(choice.path)


def check_ranks(ranks: list[int] | None, store_path: str, *, home: Path | None = None) -> None:
    """``--rank 99`` where the run has no rank 99: one line naming the ranks that exist (exit 2)."""
    if not ranks:
        return
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.recorder import open_store

    store = open_store(store_path, home=home_path(home))
    try:
        known = store.ranks()
    finally:
        store.close()
    unknown = [rank for rank in ranks if rank not in known]
    if unknown:
        whole = [rank for rank in known if type(rank) is int]  # as ranges: a thousand ranks read as 0-999
        named = ([options.format_ranks(whole)] if whole else []) + [str(r) for r in known if type(r) is not int]
        listed = ", ".join(named) or "none (no record carries a rank)"
        raise UsageError(f"no rank {', '.join(map(str, unknown))} in this run; ranks recorded: {listed}",
                         fix="pick one of those ranks, or leave --rank out")


_SQLITE_HEADER = b"SQLite format 3\x00"


def _checked_run(run: str | None, home: Path) -> str | None:
    """``--run latest`` is the run ``runs/latest`` names (or the newest); a file given must be a SQLite store."""

    if run == "latest":
        marker = home / "runs" / "latest"
        try:
            named = marker.read_text().strip() if marker.is_file() else ""
        except OSError:
            named = ""
        return named or None
    if run is None:
        return run
    path = Path(run).expanduser()
    try:
        if path.is_file():
            with path.open("rb") as handle:
                header = handle.read(len(_SQLITE_HEADER))
            if header and header != _SQLITE_HEADER:  # an empty file is a store SQLite has not written yet
                raise UsageError(f"{run} is not a raysleuth evidence store (not a SQLite database)",
                                 fix="pass a run id (see ~/.raysleuth/runs or --home) or a path to an evidence.sqlite")
    except OSError:
        pass
    return run


def connect(address: str | None):
    """Connect to the user's cluster (never starts one); errors become one red line."""

    return cluster.connect(address)


def announce_cluster(event) -> None:
    """The header of every live command, on stderr: the GCS address and session, and any other cluster alive.

    Registered with ``cluster.on_connect``, so whichever feature connects, the user sees which cluster it is:
    first the choice (when other clusters are alive and the user named none: no --address, no RAY_ADDRESS), then,
    once connected, ``cluster ADDRESS · session NAME``.
    """
    from rich.markup import escape

    if isinstance(event, AddressChoice):
        notice = event.notice() if event.reason not in ("--address", "RAY_ADDRESS") else None  # unless named
        if notice:
            err_console.print(f"[yellow]{escape(notice)}[/yellow]", soft_wrap=True)
        return
    err_console.print(f"[dim]cluster {escape(event.address)} · session {escape(event.session_name)}[/dim]",
                      soft_wrap=True)


def _listen() -> None:
    on_connect(announce_cluster)


_listen()
