"""Reading logs back: the store's ``log`` records (``raysleuth logs``) and raw Ray log files.

- :func:`query_logs` filters a run's ``log`` records by rank, level, regex,
  time and step; :func:`follow_logs` polls for new ones (``after_id``).
- :func:`ray_worker_logs` pulls a worker's raw stdout/stderr files through
  Ray's State API (via :mod:`raysleuth.cluster`), labelled with its rank:
  for output that never went through ``logging`` (``print``, C++ warnings).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from raysleuth import cluster
from raysleuth.errors import StoreNotFound, UsageError, WorkerNotFound
from raysleuth.logs.aggregate import LogLine
from raysleuth.options import parse_since, parse_steps
from raysleuth.recorder import open_store

__all__ = [
    "LEVELS",
    "LogLine",
    "LogQuery",
    "RayLog",
    "follow_logs",
    "levels_at_or_above",
    "query_logs",
    "ray_worker_logs",
]

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def levels_at_or_above(level: str | None) -> list[str] | None:
    """``"WARNING"`` -> ``["WARNING", "ERROR", "CRITICAL"]``; ``None`` -> ``None`` (all)."""
    if level is None:
        return None
    name = level.strip().upper()
    if name == "WARN":
        name = "WARNING"
    if name not in LEVELS:
        raise UsageError(f"--level {level!r} is not a logging level", fix=f"use one of {', '.join(LEVELS)}")
    return list(LEVELS[LEVELS.index(name):])


@dataclasses.dataclass
class LogQuery:
    """The filters of ``raysleuth logs``."""

    ranks: list[int] | None = None
    level: str | None = None
    grep: str | None = None
    since: str | float | None = None
    """``10m``, an ISO time, or a Unix time."""
    step: str | tuple[int | None, int | None] | None = None
    """``100-120`` (or ``100``, ``100-``, ``-120``), or a :class:`~raysleuth.options.StepRange`."""
    name: str | None = None
    limit: int | None = None
    jobs: list[str] | None = None
    """Only these Ray job ids (``--job``)."""

    def compiled(self) -> dict[str, Any]:
        """Validated store filters (raises :class:`UsageError` on bad input)."""
        step_min, step_max = parse_steps(self.step) or (None, None)
        pattern = None
        if self.grep:
            try:
                pattern = re.compile(self.grep)
            except re.error as error:
                raise UsageError(f"--grep {self.grep!r} is not a regular expression ({error})",
                                 fix="escape special characters, e.g. 'loss\\\\[0\\\\]'") from None
        return {"rank": self.ranks, "levels": levels_at_or_above(self.level), "since": parse_since(self.since),
                "step_min": step_min, "step_max": step_max, "pattern": pattern, "job": self.jobs or None}


def _matches(line: LogLine, pattern: re.Pattern | None, name: str | None) -> bool:
    if name is not None and not (line.name == name or (line.name or "").startswith(name + ".")):
        return False
    if pattern is None:
        return True
    return bool(pattern.search(line.message) or (line.exc_text and pattern.search(line.exc_text)))


def query_logs(query: LogQuery, *, run: str | None = None, home: Path | str | None = None,
               after_id: int | None = None, store=None) -> list[LogLine]:
    """The run's ``log`` records matching ``query``, oldest first (the newest ``limit`` when given)."""
    filters = query.compiled()
    own = store is None
    store = store or open_store(run, home=home)
    try:
        # --grep and --name filter after SQL; with a limit, read newest-first in pages until it is met.
        if query.limit is None or (filters["pattern"] is None and query.name is None):
            records = store.query("log", rank=filters["rank"], job=filters["job"], since=filters["since"],
                                  after_id=after_id,
                                  step_min=filters["step_min"], step_max=filters["step_max"],
                                  levels=filters["levels"], limit=query.limit,
                                  newest_first=query.limit is not None)
            lines = [LogLine.from_record(r) for r in records]
            lines = [line for line in lines if _matches(line, filters["pattern"], query.name)]
        else:
            lines = [LogLine.from_record(r) for r in store.query(
                "log", rank=filters["rank"], job=filters["job"], since=filters["since"], after_id=after_id,
                step_min=filters["step_min"], step_max=filters["step_max"], levels=filters["levels"],
                newest_first=True)]
            lines = [line for line in lines if _matches(line, filters["pattern"], query.name)][:query.limit]
    finally:
        if own:
            store.close()
    return sorted(lines, key=lambda line: (line.time, line.id))


def follow_logs(query: LogQuery, *, run: str | None = None, home: Path | str | None = None,
                interval: float = 0.5, after_id: int | None = None, max_records: int | None = None,
                timeout: float | None = None, start_at_end: bool = True) -> Iterator[LogLine]:
    """Yield matching records as they arrive (polls ``after_id`` every ``interval`` s).

    Starts after the newest record (``start_at_end``) unless ``after_id`` is
    given; stops after ``max_records`` lines or ``timeout`` seconds.
    """
    query = dataclasses.replace(query, limit=None)
    deadline = None if timeout is None else time.monotonic() + timeout
    store = None
    seen = 0
    while deadline is None or time.monotonic() < deadline:
        if store is None:
            try:
                store = open_store(run, home=home)
            except StoreNotFound:
                time.sleep(interval)
                continue
            if after_id is None and start_at_end:
                newest = store.query("log", newest_first=True, limit=1)
                after_id = newest[0].id if newest else 0
        lines = query_logs(query, after_id=after_id, store=store)
        if lines:
            after_id = max(after_id or 0, max(line.id or 0 for line in lines))
        for line in lines:
            yield line
            seen += 1
            if max_records is not None and seen >= max_records:
                store.close()
                return
        time.sleep(interval)
    if store is not None:
        store.close()


# --------------------------------------------------------------- Ray logs


@dataclasses.dataclass
class RayLog:
    """A worker's raw Ray log (stdout or stderr of its actor), labelled with its rank."""

    rank: int | None
    actor_id: str | None
    pid: int | None
    node_id: str | None
    node_ip: str | None
    actor_class: str | None
    stream: str
    """``out`` or ``err``."""
    lines: list[str]
    error: str | None = None

    @property
    def label(self) -> str:
        """``rank 3`` (or ``pid 123``)."""
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        result = dataclasses.asdict(self)
        result["label"] = self.label
        return result


def _rank_from_store(rank: int | None = None, pid: int | None = None, actor_id: str | None = None,
                     run: str | None = None, home: Path | str | None = None) -> dict[str, Any] | None:
    """The newest evidence row written by that rank/pid/actor: its identity columns."""
    try:
        store = open_store(run, home=home)
    except Exception:
        return None
    try:
        if rank is not None:
            records = store.query(rank=rank, newest_first=True, limit=200)
        else:
            records = store.query(newest_first=True, limit=5000)
        for record in records:
            if record.actor_id is None:
                continue
            if pid is not None and record.pid != pid:
                continue
            if actor_id is not None and record.actor_id != actor_id:
                continue
            return {"rank": record.rank, "actor_id": record.actor_id, "pid": record.pid,
                    "node_id": record.node_id, "node_ip": record.node_ip, "actor_class": record.actor_class}
    except Exception:
        return None
    finally:
        store.close()
    return None


def find_worker(*, rank: int | None = None, pid: int | None = None, actor_id: str | None = None,
                run: str | None = None, home: Path | str | None = None) -> dict[str, Any]:
    """The live actor of a rank, pid or actor id: its actor id, pid, node and rank.

    Ranks come from the evidence store (what instruments recorded), else from
    the actor names (``labels.live.registered_labels``). Raises :class:`WorkerNotFound`.
    """
    # rs.get_logger and rs.debug_decorator load this package.
    # lazy: the instruments stay light to import: the node agents (labels) load when a query names a worker
    from raysleuth.labels.live import registered_labels

    if rank is None and pid is None and actor_id is None:
        raise UsageError("--ray needs a worker", fix="add --rank R, --pid P or --actor-id ID")
    found = _rank_from_store(rank, pid, actor_id, run, home)
    labels = registered_labels()
    if found is None:
        for label in labels.values():
            if ((rank is not None and label.get("rank") == rank) or (pid is not None and label.get("pid") == pid)
                    or (actor_id is not None and label.get("actor_id") == actor_id)):
                found = dict(label)
                break
    if found is None and actor_id is not None:
        found = {"actor_id": actor_id, "rank": None, "pid": None, "node_id": None, "node_ip": None}
    if found is None:
        what = f"rank {rank}" if rank is not None else f"pid {pid}"
        known = sorted({label["rank"] for label in labels.values() if label.get("rank") is not None})
        raise WorkerNotFound(f"no live worker with {what}",
                             fix=f"known ranks: {', '.join(map(str, known)) or 'none'}; "
                                 "instrument the workers (rs.set_rank / RANK env) or pass --actor-id")
    if found.get("rank") is None and found.get("actor_id"):
        for label in labels.values():
            if label.get("actor_id") == found["actor_id"] and label.get("rank") is not None:
                found["rank"] = label["rank"]
    return found


def ray_worker_logs(*, rank: int | None = None, pid: int | None = None, actor_id: str | None = None,
                    streams: tuple[str, ...] = ("out", "err"), tail: int = 1000, run: str | None = None,
                    home: Path | str | None = None) -> list[RayLog]:
    """The raw stdout/stderr Ray kept for one worker, labelled with its rank (needs a connection)."""
    worker = find_worker(rank=rank, pid=pid, actor_id=actor_id, run=run, home=home)
    result = []
    for stream in streams:
        lines: list[str] = []
        error = None
        try:
            lines = cluster.worker_log(actor_id=worker.get("actor_id"), pid=None if worker.get("actor_id") else
                                       worker.get("pid"), node_id=worker.get("node_id"), suffix=stream, tail=tail)
        except Exception as failure:
            error = str(failure)
        result.append(RayLog(rank=worker.get("rank"), actor_id=worker.get("actor_id"), pid=worker.get("pid"),
                             node_id=worker.get("node_id"), node_ip=worker.get("node_ip"),
                             actor_class=worker.get("actor_class"), stream=stream, lines=lines, error=error))
    return result
