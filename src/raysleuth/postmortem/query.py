"""Reading crash capsules back from the evidence store (``raysleuth crashes``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth import evidence
from raysleuth.evidence import Crash
from raysleuth.errors import UsageError


@dataclasses.dataclass(frozen=True, kw_only=True)
class CrashSummary:
    """One line of ``raysleuth crashes``: a capsule, without its frames and environment."""

    id: int
    time: float
    rank: int | None
    node_ip: str | None
    hostname: str | None
    pid: int | None
    actor: str | None
    method: str | None
    exception_type: str
    message: str
    cause: str | None
    """Title of the root cause ``explain`` found, if any."""

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        return dataclasses.asdict(self)


def _first_line(text: str, limit: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def list_crashes(run: str | None = None, *, home: Any = None, rank: int | list[int] | None = None,
                 limit: int | None = None, job: list[str] | str | None = None) -> list[CrashSummary]:
    """The crash capsules of a run (default: the latest), oldest first. Reads the store only."""
    # lazy: rs.capture_crashes stays light to import: this loads when a crash is captured
    from raysleuth.recorder import open_store

    store = open_store(run, home=home)
    try:
        capsules = evidence.read(store, Crash, rank=rank, job=job, limit=limit, newest_first=limit is not None)
    finally:
        store.close()
    if limit is not None:
        capsules.reverse()
    return [CrashSummary(
        id=capsule.row.id or 0, time=capsule.row.time, rank=capsule.row.rank,
        node_ip=capsule.row.node_ip or capsule.node_ip, hostname=capsule.row.hostname or capsule.hostname,
        pid=capsule.row.pid or capsule.pid, actor=capsule.actor_name or capsule.actor_class or capsule.row.actor_class,
        method=capsule.method, exception_type=capsule.exception_type, message=_first_line(capsule.message),
        cause=capsule.explanations[0].title if capsule.explanations else None,
    ) for capsule in capsules]


def get_crash(capsule_id: int, run: str | None = None, *, home: Any = None) -> Crash:
    """One capsule in full, as stored: its data fields and its record's columns (``row``)."""
    # lazy: rs.capture_crashes stays light to import: this loads when a crash is captured
    from raysleuth.recorder import open_store

    if not 0 < int(capsule_id) < 2**63:
        raise UsageError(f"no crash capsule with id {capsule_id}", fix="ids are the positive numbers `raysleuth crashes` lists")
    store = open_store(run, home=home)
    try:
        capsules = evidence.read(store, Crash, after_id=int(capsule_id) - 1, limit=1)
    finally:
        store.close()
    if not capsules or capsules[0].row.id != int(capsule_id):
        raise UsageError(f"no crash capsule with id {capsule_id} in this run",
                         fix="list them with `raysleuth crashes` (and pass the same --run/--home)")
    return capsules[0]
