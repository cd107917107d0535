"""Private files: evidence folders are 0700 and evidence files 0600, whatever the umask.

Runs and spools hold captured locals, environments and log lines, so a
permissive umask (``umask 000`` on a shared node) must not make them
readable by other users. Only creation is handled here: a folder or file
that exists keeps the mode its owner gave it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DIR_MODE", "FILE_MODE", "private_dir", "private_file", "write_private"]

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path | str) -> Path:
    """Create ``path`` and any missing parent as 0700 folders; returns it."""
    path = Path(path)
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(folder, DIR_MODE)  # mkdir's mode passes through the umask
    return path


def private_file(path: Path | str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """Open ``path`` (created 0600, its folder 0700) with ``flags``; returns the descriptor."""
    path = Path(path)
    private_dir(path.parent)
    existed = path.exists()
    fd = os.open(path, flags, FILE_MODE)
    if not existed:
        os.fchmod(fd, FILE_MODE)
    return fd


def write_private(path: Path | str, data: bytes) -> None:
    """Write ``data`` to a new or truncated 0600 file."""
    fd = private_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
