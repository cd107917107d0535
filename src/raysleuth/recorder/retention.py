"""Retention: which runs ``raysleuth gc`` removes under ``RAYSLEUTH_RETAIN`` (an age, a size, or both).

``7d`` keeps runs written to in the last seven days; ``20GB`` keeps the
newest runs that fit in 20 GB together; ``7d,20GB`` keeps what both keep.
The newest run (the ``latest`` marker, else the newest database) is never
removed, nor a run written to in the last :data:`BUSY_SECONDS` (a job may
still be writing it). A removed run takes its spool folder with it.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import time
from pathlib import Path
from typing import Any

from raysleuth.errors import UsageError
from raysleuth.options import parse_duration
from raysleuth.recorder.store import DB_NAME, latest_run, list_runs, run_dir

__all__ = ["BUSY_SECONDS", "Retention", "RunUsage", "parse_retain", "plan_gc", "remove_runs"]

BUSY_SECONDS = 600.0
"""A run written to this recently is kept whatever the policy says."""
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


@dataclasses.dataclass(frozen=True)
class Retention:
    """What to keep: runs younger than ``max_age_s``, the newest runs within ``max_bytes`` (None: no bound)."""

    max_age_s: float | None = None
    max_bytes: int | None = None


@dataclasses.dataclass
class RunUsage:
    """One run on disk: its size, when it was last written, and what gc decided."""

    run_id: str
    path: str
    bytes: int
    modified: float
    remove: bool = False
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_retain(text: str | None) -> Retention | None:
    """``"7d"``, ``"20GB"``, ``"7d,20GB"`` -> :class:`Retention`; ``None`` or blank -> ``None`` (keep all)."""
    if text is None or not text.strip():
        return None
    age = size = None
    for part in (piece.strip() for piece in text.split(",")):
        sized = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)", part, re.IGNORECASE)
        if sized:
            size = int(float(sized.group(1)) * _UNITS[sized.group(2).lower()])
            continue
        try:
            age = parse_duration(part, option="RAYSLEUTH_RETAIN")
        except UsageError:
            raise UsageError(f"RAYSLEUTH_RETAIN={text!r}: {part!r} is neither an age nor a size",
                             fix="e.g. RAYSLEUTH_RETAIN=7d, RAYSLEUTH_RETAIN=20GB or RAYSLEUTH_RETAIN=7d,20GB") from None
    return Retention(max_age_s=age, max_bytes=size)


def _usage(home: Path, run_id: str) -> RunUsage:
    folder = run_dir(home, run_id)
    size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    return RunUsage(run_id=run_id, path=str(folder), bytes=size, modified=(folder / DB_NAME).stat().st_mtime)


def plan_gc(home: Path | str, retention: Retention, *, now: float | None = None) -> list[RunUsage]:
    """Every run under ``home``, newest first, each marked ``remove`` or kept with the reason."""
    home, now = Path(home), time.time() if now is None else now
    runs = [_usage(home, run_id) for run_id in reversed(list_runs(home))]  # newest first
    newest = latest_run(home)
    kept_bytes = 0
    for usage in runs:
        if usage.run_id == newest:
            usage.reason = "the newest run"
        elif now - usage.modified < BUSY_SECONDS:
            usage.reason = f"written to in the last {BUSY_SECONDS / 60:.0f} minutes"
        elif retention.max_age_s is not None and now - usage.modified > retention.max_age_s:
            usage.remove, usage.reason = True, f"older than {retention.max_age_s / 86400:g} days"
        elif retention.max_bytes is not None and kept_bytes + usage.bytes > retention.max_bytes:
            usage.remove, usage.reason = True, f"past {retention.max_bytes / 1e9:g} GB of newer runs"
        else:
            usage.reason = "within the policy"
        if not usage.remove:
            kept_bytes += usage.bytes
    return runs


def remove_runs(home: Path | str, runs: list[RunUsage]) -> list[str]:
    """Delete the runs marked ``remove`` (and their spools); returns what could not be removed, with why."""
    problems = []
    for usage in runs:
        if not usage.remove:
            continue
        for folder in (Path(usage.path), Path(home) / "spool" / usage.run_id):
            try:
                if folder.exists():
                    shutil.rmtree(folder)
            except OSError as error:
                problems.append(f"{folder}: {error.strerror or error}")
    return problems
