"""The ``raysleuth`` command line: parse, call a feature, render its result.

Each command lives in ``raysleuth/cli/<command>.py`` and registers itself
on the shared :data:`app`; :func:`main` maps errors to one red line and an
exit code (2 usage or connection, 1 problem found, 0 all good).
"""

from __future__ import annotations

import importlib
import os
import sys

from raysleuth import entry
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
    "gc",
    "logs",
    "memory",
    "report",
    "run",
    "stacks",
    "stragglers",
    "tasks",
    "timeline",
    "weights",
)

#: The commands whose module is named otherwise.
MODULE_OF = {"advise": "explain", "watch": "stacks", "trace": "tasks"}


def modules_to_load(first: str | None) -> tuple[str, ...]:
    """The command modules to import: only the one of the command the command line runs (``first``, its first
    word: :data:`raysleuth.entry.FIRST`), else every one (``--help``, no command, a word no command has, a
    program that imports this module)."""
    module = MODULE_OF.get(first, first) if first else None
    return (module,) if module in COMMAND_MODULES else COMMAND_MODULES


for _module in modules_to_load(entry.FIRST):
    importlib.import_module(f"raysleuth.cli.{_module}")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code.

    Commands end with ``typer.Exit(code)``; a usage error (bad option, bad
    value) and a :class:`RaySleuthError` become one red line and exit 2 (or
    the error's code). Anything else is a bug in raysleuth: one line naming
    it, exit 2, and the traceback only with ``RAYSLEUTH_DEBUG=1``.
    """
    try:
        code = app(args=argv, prog_name="raysleuth", standalone_mode=False)
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    except KeyboardInterrupt:
        err_console.print("[red]interrupted[/red]")
        return 130
    except RaySleuthError as error:
        _one_line(str(error))
        return error.exit_code
    except OSError as error:  # a path given on the command line the system refuses (too long, no access)
        where = f": {str(error.filename)[:200]}" if error.filename else ""
        _one_line(f"{error.strerror or error}{where}")
        return 2
    except Exception as error:
        if _is(error, "Abort"):
            err_console.print("[red]interrupted[/red]")
            return 130
        if _is(error, "NoArgsIsHelpError"):
            app(args=["--help"], prog_name="raysleuth", standalone_mode=False)
            return 2
        if _is(error, "ClickException"):  # click's, or the copy typer ships: a usage error
            context = getattr(error, "ctx", None)
            where = f" (see `{context.command_path} --help`)" if context is not None else ""
            message = error.format_message() if hasattr(error, "format_message") else str(error)
            _one_line(f"{message}{where}")
            return int(getattr(error, "exit_code", 2) or 2)
        if os.environ.get("RAYSLEUTH_DEBUG"):  # a bug: never a traceback on the user's terminal
            raise
        _one_line(f"internal error {type(error).__name__}: {error} (a raysleuth bug; RAYSLEUTH_DEBUG=1 shows "
                  "the traceback)")
        return 2
    return code if isinstance(code, int) else 0


def _is(error: BaseException, name: str) -> bool:
    return any(kind.__name__ == name for kind in type(error).__mro__)


def _one_line(message: str) -> None:
    from rich.markup import escape

    text = " ".join(str(message).split())
    err_console.print(f"[red]raysleuth: {escape(text)}[/red]", soft_wrap=True)


def run() -> None:
    """Console-script entry point."""
    # lazy: the recorder loads when a command needs it (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.recorder.reading import command_line_process

    command_line_process()
    sys.exit(main())
