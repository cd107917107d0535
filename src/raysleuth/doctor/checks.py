"""What one finding of the doctor is, and the versions and sizes the checks judge against."""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["Check", "CheckStatus", "MIN_DEBUGPY", "MIN_FREE_DISK", "MIN_FREE_DISK_FAIL", "MIN_RAY"]

MIN_RAY = "2.10"
MIN_DEBUGPY = "1.8"
MIN_FREE_DISK = 5 * 1024**3
MIN_FREE_DISK_FAIL = 1 * 1024**3


CheckStatus = Literal["ok", "warn", "fail", "skip"]
"""A check's outcome: ``fail`` makes the doctor exit 1; ``skip`` says what was not checked and why."""


@dataclasses.dataclass(kw_only=True)
class Check:
    """One finding of the doctor."""

    name: str
    status: CheckStatus
    """``ok``, ``warn``, ``fail`` or ``skip``."""
    detail: str
    fix: str | None = None
    node: str | None = None
    """The node (ip) a per-node check is about."""
    category: str = "local"


def _version_tuple(text: str | None):
    from packaging.version import InvalidVersion, Version

    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _at_least(found: str | None, minimum: str) -> bool:
    found_version = _version_tuple(found)
    return found_version is not None and found_version >= _version_tuple(minimum)
