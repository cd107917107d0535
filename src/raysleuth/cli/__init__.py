"""The ``raysleuth`` command line: parse, call a feature, render its result.

Each command lives in ``raysleuth/cli/<command>.py`` and registers itself
on the shared :data:`app`; :func:`main` maps errors to one red line and an
exit code (2 usage or connection, 1 problem found, 0 all good).
"""

from __future__ import annotations

import importlib
import sys

from raysleuth.cli._app import app, err_console
from raysleuth.errors import RaySleuthError

__all__ = ["app", "main"]

# One module per command group; importing it registers its commands.
COMMAND_MODULES = (
    "collectives",
    "consistency",
    "crashes",
    "debug",
    "demo",
    "doctor",
    "explain",
    "logs",
    "memory",
    "report",
    "stacks",
    "tasks",
    "timeline",
)

for _module in COMMAND_MODULES:
    importlib.import_module(f"raysleuth.cli.{_module}")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code.

    Commands end with ``typer.Exit(code)``; usage errors are typer's (exit 2);
    a :class:`RaySleuthError` becomes one red line and its exit code.
    """
    try:
        app(args=argv, prog_name="raysleuth", standalone_mode=True)
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    except KeyboardInterrupt:
        err_console.print("[red]interrupted[/red]")
        return 130
    except RaySleuthError as error:
        err_console.print(f"[red]raysleuth: {error}[/red]", soft_wrap=True)
        return error.exit_code
    return 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
