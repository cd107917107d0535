"""The ``raysleuth`` command's entry point (its console script, and ``python -m raysleuth``).

It notes the command line's first word before :mod:`raysleuth.cli` loads, so that only the module of the command
it runs is imported and registered, not all seventeen (``raysleuth report``: 0.14 -> 0.06 s of imports). A program
that imports :mod:`raysleuth.cli` itself gets every command, as before.
"""

from __future__ import annotations

import sys

#: The command line's first word (a command's name, an option, or "" for none) when this process is the command
#: line; None in any other process.
FIRST: str | None = None


def run() -> None:
    """Run the command line on ``sys.argv``."""
    global FIRST
    FIRST = sys.argv[1] if len(sys.argv) > 1 else ""
    # lazy: raysleuth.cli reads FIRST as it loads, so it is set first
    from raysleuth.cli import run as run_command_line

    run_command_line()
