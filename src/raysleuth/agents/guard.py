"""What a node agent will run and read for a caller: the tools and files raysleuth needs, nothing else.

An agent is a long-lived actor that anyone who can call Ray actors can
reach, so its two general-purpose doors are narrowed:

- ``run_tool(argv)`` runs only :data:`TOOLS`: ``ps`` (the process listing of
  ``raysleuth stacks``), ``py-spy dump`` (stacks) and ``py-spy record -o /dev/stdout`` (stragglers' sampling: never a file), each found by the
  agent itself (a program of the same name elsewhere is refused);
- ``read_files(paths)`` reads only under Ray's session folder of this node
  (logs, raysleuth's fatal-signal files), ``$RAYSLEUTH_HOME``, and
  ``/proc/<pid>`` of this node's Ray workers.

Anything else raises :class:`~raysleuth.errors.PermissionDenied` naming
what was refused and what is allowed.
"""

from __future__ import annotations

import os
from pathlib import Path

from raysleuth import cluster, runtime
from raysleuth.agents.host import find_tool
from raysleuth.agents.ranks import is_ray_worker
from raysleuth.errors import PermissionDenied

__all__ = ["TOOLS", "check_paths", "check_tool"]

#: Program name -> the first arguments it may be given (None: any arguments).
TOOLS: dict[str, frozenset[str] | None] = {"ps": None, "py-spy": frozenset({"dump", "record"})}


def check_tool(argv: list[str]) -> None:
    """Raise PermissionDenied unless ``argv`` is an allowed tool, as this agent would find it."""
    if not isinstance(argv, (list, tuple)) or not argv or not all(isinstance(part, str) for part in argv):
        raise PermissionDenied(f"raysleuth agent: run_tool needs a list of strings, got {argv!r}",
                               fix=f"run one of {', '.join(sorted(TOOLS))}")
    program = argv[0]
    name = os.path.basename(program)
    known = find_tool(name) if name in TOOLS else None
    same = known is not None and (program == name or os.path.realpath(program) == os.path.realpath(known))
    if not same:
        raise PermissionDenied(f"raysleuth agent: run_tool refuses {program!r}",
                               fix=f"an agent runs only {', '.join(sorted(TOOLS))}, as found on its node's PATH")
    allowed = TOOLS[name]
    if allowed is not None and (len(argv) < 2 or argv[1] not in allowed):
        raise PermissionDenied(f"raysleuth agent: run_tool refuses {name} {' '.join(argv[1:2])!r}",
                               fix=f"{name} runs only as: {', '.join(f'{name} {verb}' for verb in sorted(allowed))}")
    if name == "py-spy" and argv[1] == "record" and _output_of(argv) != "/dev/stdout":
        raise PermissionDenied(f"raysleuth agent: run_tool refuses py-spy record writing to {_output_of(argv)!r}",
                               fix="py-spy record runs only with -o /dev/stdout (its samples come back, no file)")


def _output_of(argv: list[str]) -> str | None:
    """The file ``py-spy record`` would write (``-o``/``--output``), or None."""
    for index, part in enumerate(argv):
        if part in ("-o", "--output") and index + 1 < len(argv):
            return argv[index + 1]
        if part.startswith("--output="):
            return part.split("=", 1)[1]
    return None


def _roots() -> list[Path]:
    roots = [Path(runtime.settings().home)]
    logs = cluster.local_logs_dir()
    if logs:
        roots.append(Path(logs).parent)  # the session folder: logs/, logs/old/
    return [Path(os.path.realpath(root)) for root in roots]


def _ray_worker_pid(pid: int) -> bool:
    try:
        import psutil

        return is_ray_worker(psutil.Process(pid).cmdline())
    except Exception:
        return False


def check_paths(paths: list[str]) -> None:
    """Raise PermissionDenied unless every path is under a folder an agent may read."""
    if not isinstance(paths, (list, tuple)):
        raise PermissionDenied(f"raysleuth agent: read_files needs a list of paths, got {type(paths).__name__}")
    roots = _roots()
    for path in paths:
        real = Path(os.path.realpath(str(path)))
        if any(real == root or root in real.parents for root in roots):
            continue
        parts = real.parts
        if len(parts) >= 3 and parts[1] == "proc" and parts[2].isdigit() and _ray_worker_pid(int(parts[2])):
            continue
        raise PermissionDenied(
            f"raysleuth agent: read_files refuses {path!r}",
            fix="an agent reads only Ray's session folder, $RAYSLEUTH_HOME and /proc/<pid> of Ray workers: "
                + ", ".join(str(root) for root in roots))
