"""Reading crash capsules back from the evidence store (``raysleuth crashes``)."""

from __future__ import annotations

import dataclasses
from typing import Any

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
        records = store.query("crash", rank=rank, job=job, limit=limit, newest_first=limit is not None)
    finally:
        store.close()
    if limit is not None:
        records.reverse()
    summaries = []
    for record in records:
        data = record.data or {}
        explanations = data.get("explanations") or []
        summaries.append(CrashSummary(
            id=record.id, time=record.time, rank=record.rank, node_ip=record.node_ip or data.get("node_ip"),
            hostname=record.hostname or data.get("hostname"), pid=record.pid or data.get("pid"),
            actor=data.get("actor_name") or data.get("actor_class") or record.actor_class,
            method=data.get("method"), exception_type=str(data.get("exception_type", "?")),
            message=_first_line(str(data.get("message", ""))),
            cause=explanations[0]["title"] if explanations else None,
        ))
    return summaries


def get_crash(capsule_id: int, run: str | None = None, *, home: Any = None) -> dict[str, Any]:
    """One capsule in full: the record's identity columns plus the capsule (``data``)."""
    # lazy: rs.capture_crashes stays light to import: this loads when a crash is captured
    from raysleuth.recorder import open_store

    if not 0 < int(capsule_id) < 2**63:
        raise UsageError(f"no crash capsule with id {capsule_id}", fix="ids are the positive numbers `raysleuth crashes` lists")
    store = open_store(run, home=home)
    try:
        records = store.query("crash", after_id=int(capsule_id) - 1, limit=1)
    finally:
        store.close()
    if not records or records[0].id != int(capsule_id):
        raise UsageError(f"no crash capsule with id {capsule_id} in this run",
                         fix="list them with `raysleuth crashes` (and pass the same --run/--home)")
    return records[0].to_dict()
