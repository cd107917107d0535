"""``raysleuth run -- python train.py ARGS...``: run a job unchanged, with every Ray worker instrumented.

The driver is started as it is, with the same stdin/stdout/stderr and
arguments; its environment gains ``RAY_RUNTIME_ENV_HOOK`` (Ray calls it in
the driver's ``ray.init`` to add raysleuth's ``worker_process_setup_hook``
to the job's ``runtime_env``), ``RAYSLEUTH_MODE`` and, when given,
``RAY_ADDRESS`` / ``RAYSLEUTH_HOME``. Nothing is printed: the job's output
is the job's. The exit code is the job's (128 + N when it died of signal N).

Signals: Ctrl-C in a terminal reaches the job directly (same process
group), so it is not sent twice; a SIGINT sent to ``raysleuth run`` alone
(``kill -INT``), and SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 are passed
on to the job.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer

from raysleuth import cluster
from raysleuth.cli._app import HomeOption, app, finish
from raysleuth.errors import UsageError

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def job_environment(env: Mapping[str, str], *, mode: str | None, address: str | None,
                    home: Path | None) -> dict[str, str]:
    """The driver's environment under ``raysleuth run`` (pure: ``env`` is not changed)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.worker_setup.hook import ENV_HOOK, PREVIOUS_ENV_HOOK

    result = dict(env)
    previous = result.get("RAY_RUNTIME_ENV_HOOK")
    if previous and previous != ENV_HOOK:
        result[PREVIOUS_ENV_HOOK] = previous
    result["RAY_RUNTIME_ENV_HOOK"] = ENV_HOOK
    if mode:
        result["RAYSLEUTH_MODE"] = mode
    if address:
        result["RAY_ADDRESS"] = address
    if home is not None:
        result["RAYSLEUTH_HOME"] = str(Path(home).expanduser().resolve())
    source_root = _source_root()
    if source_root is not None:
        paths = [part for part in result.get("PYTHONPATH", "").split(os.pathsep) if part]
        if source_root not in paths:
            result["PYTHONPATH"] = os.pathsep.join([source_root, *paths])
    return result


def _source_root() -> str | None:
    """The folder holding the ``raysleuth`` package when it runs from a checkout (not site-packages)."""
    import raysleuth  # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)

    root = Path(raysleuth.__file__).resolve().parent.parent
    return None if root.name in ("site-packages", "dist-packages") else str(root)


def exit_code(returncode: int) -> int:
    """A child's return code as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _in_terminal_foreground() -> bool:
    """True when Ctrl-C from a terminal reaches our process group (and so the job) directly."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            if os.isatty(stream.fileno()):
                return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            continue
    return False


def run_job(command: list[str], env: Mapping[str, str]) -> int:
    """Run ``command`` with ``env``, passing signals on; returns its exit code."""
    try:
        child = subprocess.Popen(command, env=dict(env))
    except FileNotFoundError:
        raise UsageError(f"command not found: {command[0]}", fix="give the job's command after --, "
                         "e.g. raysleuth run -- python train.py") from None
    except PermissionError:
        raise UsageError(f"cannot execute {command[0]}", fix="check the file is executable") from None

    def forward(signum: int, _frame: object) -> None:
        if signum == signal.SIGINT and _in_terminal_foreground():
            return  # the terminal sent it to the job too
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {}
    for signum in (signal.SIGINT, *FORWARDED_SIGNALS):
        previous[signum] = signal.signal(signum, forward)
    try:
        while True:
            try:
                return exit_code(child.wait())
            except InterruptedError:
                continue
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    command: Annotated[list[str] | None, typer.Argument(help="The job's command, after --: -- python train.py ARGS")] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="light (default) or full; off runs the job uninstrumented.")] = None,
    address: Annotated[str | None, typer.Option(
        "--address", help="Sets RAY_ADDRESS for the job's ray.init: ip:port, auto, or local (start a new local Ray); "
                          "default: whatever the job does alone.")] = None,
    home: HomeOption = None,
) -> None:
    """Run a job unchanged with every Ray worker instrumented: crash capsules, fatal signals, ranks, logs, memory.

    The job's output and exit code are its own. Then: raysleuth crashes, stacks, logs, memory, report.
    """
    if not command:
        raise UsageError("no command to run", fix="put the job's command after --: raysleuth run -- python train.py")
    if mode is not None and mode not in ("off", "light", "full"):
        raise UsageError(f"unknown mode {mode!r}", fix="use --mode light, full or off")
    if shutil.which(command[0]) is None and not Path(command[0]).is_file():
        raise UsageError(f"command not found: {command[0]}", fix="give the job's command after --, "
                         "e.g. raysleuth run -- python train.py")
    env = job_environment(os.environ, mode=mode, address=address, home=home)
    env.update(_auth_environment(address, env))
    finish(run_job(list(command), env))


def _auth_environment(address: str | None, env: Mapping[str, str]) -> dict[str, str]:
    """``RAY_AUTH_MODE=token`` for a job that attaches to a token-auth cluster (Ray's own driver would not know).

    The token itself stays where it is (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``,
    which Ray reads in token mode); it is never copied or printed. A cluster that wants a token none of those
    holds fails here, in one line, instead of the job's 20 InvalidAuthToken retries.
    """
    if not address or address in ("local", "auto") or address.startswith("ray://") or env.get("RAY_AUTH_MODE"):
        return {}

    return {"RAY_AUTH_MODE": "token"} if cluster.cluster_auth_mode(address) == "token" else {}
