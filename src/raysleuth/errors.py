"""The one error tree of raysleuth.

Every failure raysleuth reports on purpose is a ``RaySleuthError``. Its
message says what failed, shows the value, and gives the fix, on one line.
``cli.main`` prints it in red and exits with ``exit_code``.

::

    RaySleuthError                      (exit 2 unless said otherwise)
    ├── UsageError                      bad argument: unknown rank, bad range
    ├── ClusterUnreachable              no Ray at the address, or it refused us
    │   └── AuthTokenMissing            the cluster wants a token we do not have
    ├── WorkerNotFound                  no worker with that rank / pid / id
    ├── CaptureTimeout                  a cluster-wide action ran out of time
    ├── ToolMissing                     py-spy / debugpy / torch not installed
    ├── PermissionDenied                ptrace refused, file not readable
    ├── StoreError                      the evidence store
    │   ├── StoreNotFound               no run recorded under RAYSLEUTH_HOME
    │   └── StoreCorrupt                the SQLite file is not a database
    └── ProblemFound                    a check found a problem (exit 1)

``ProblemFound`` is not a crash: commands such as ``doctor`` raise it (or
return exit code 1) when the thing they examined is unhealthy.
"""

from __future__ import annotations

__all__ = [
    "AuthTokenMissing",
    "CaptureTimeout",
    "ClusterUnreachable",
    "PermissionDenied",
    "ProblemFound",
    "RaySleuthError",
    "StoreCorrupt",
    "StoreError",
    "StoreNotFound",
    "ToolMissing",
    "UsageError",
    "WorkerNotFound",
]


class RaySleuthError(Exception):
    """Base of every error raysleuth raises on purpose."""

    exit_code: int = 2

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(message if not fix else f"{message}: {fix}")


class UsageError(RaySleuthError):
    """A bad argument: an unknown rank, a malformed range, a missing file."""


class ClusterUnreachable(RaySleuthError):
    """No Ray cluster answered at the address, or it refused the connection."""


class AuthTokenMissing(ClusterUnreachable):
    """The cluster uses token authentication and no token was found."""


class WorkerNotFound(RaySleuthError):
    """No worker matches the rank, pid or id the user named."""


class CaptureTimeout(RaySleuthError):
    """A cluster-wide action did not finish in its time limit."""


class ToolMissing(RaySleuthError):
    """An external tool (py-spy, debugpy, torch) is not installed where needed."""


class PermissionDenied(RaySleuthError):
    """The operating system refused (ptrace scope, file permissions)."""


class StoreError(RaySleuthError):
    """Something is wrong with the evidence store."""


class StoreNotFound(StoreError):
    """No evidence database exists for the requested run."""


class StoreCorrupt(StoreError):
    """The evidence database file exists but is not a readable SQLite database."""


class ProblemFound(RaySleuthError):
    """A check ran and found a problem; not a crash (exit code 1)."""

    exit_code = 1
