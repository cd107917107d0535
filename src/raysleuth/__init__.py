"""raysleuth: find the culprit when distributed training on Ray goes wrong.

The public API. Names resolve lazily (``import raysleuth`` imports neither
Ray nor torch), and each one lives in the module named for what it does.
Import from here, never from a private module.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> module that defines it (or the module itself, for names such as
# ``memory`` mapped to ``raysleuth.memory``). One line each, sorted by name.
_EXPORTS: dict[str, str] = {
    "AuthTokenMissing": "raysleuth.errors",
    "CaptureTimeout": "raysleuth.errors",
    "Check": "raysleuth.doctor",
    "ClusterUnreachable": "raysleuth.errors",
    "DoctorReport": "raysleuth.doctor",
    "EvidenceStore": "raysleuth.recorder",
    "Identity": "raysleuth.runtime",
    "ProblemFound": "raysleuth.errors",
    "RaySleuthError": "raysleuth.errors",
    "Settings": "raysleuth.runtime",
    "StoreCorrupt": "raysleuth.errors",
    "StoreNotFound": "raysleuth.errors",
    "ToolMissing": "raysleuth.errors",
    "UsageError": "raysleuth.errors",
    "WorkerNotFound": "raysleuth.errors",
    "connect": "raysleuth.cluster",
    "generate_report": "raysleuth.report",
    "get_rank": "raysleuth.runtime",
    "open_store": "raysleuth.recorder",
    "record": "raysleuth.recorder",
    "run_doctor": "raysleuth.doctor",
    "set_rank": "raysleuth.runtime",
    "settings": "raysleuth.runtime",
    "whoami": "raysleuth.runtime",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raysleuth' has no attribute {name!r}")
    imported = importlib.import_module(module)
    # A name that is its own module (``rs.memory``) resolves to the module.
    value = imported if module == f"{__name__}.{name}" else getattr(imported, name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
