"""Gather collective positions: ask live workers for a dump, read the store, match.

Works on a live cluster (dump on request through the control thread, which
answers while the training thread sits inside the collective; liveness of
each rank's process from Ray) and on a stored run after the cluster is gone
(from what the workers dumped: on request, periodically in full mode, at exit).
"""

from __future__ import annotations

import dataclasses
import heapq
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from raysleuth import cluster, evidence
from raysleuth.collectives.matcher import PENDING_AFTER, match
from raysleuth.collectives.model import (
    ENTRIES_PER_GROUP,
    CollectiveVerdict,
    entries_from_dump,
    newest_job,
    positions_from_dumps,
)
from raysleuth.recorder import blocks, compact, get_writer, open_store
from raysleuth.recorder.reading import bulk, newest_per_worker, tail_records
from raysleuth.recorder.store import COLUMNS

CONTROL_KEY = "collectives.dump"
RECORD_LIMIT = 20_000


@dataclasses.dataclass
class CollectivesReport:
    """Per process group, the last collectives of every rank aligned, and the ranks that broke the sequence."""

    run: str | None
    job_id: str | None
    live: bool
    requested: bool
    answered: list[int]
    """Ranks whose dump answered this request (live only)."""
    ranks: list[dict[str, Any]]
    """Per rank: rank, pid, node_ip, alive, dumped_at."""
    verdict: CollectiveVerdict
    notes: list[str] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)
    """What was not there to compare, and how to get it (never an all-clear when not empty)."""
    groups_seen: list[str] = dataclasses.field(default_factory=list)
    """Every process group the records name (``--pg`` picks among them)."""
    unanswered: list[int] = dataclasses.field(default_factory=list)
    """Live ranks whose newest positions fall outside the rows shown because they did not answer this dump
    request in time: nothing is known of where they are now (the verdict cannot tell, never "agree")."""

    @property
    def exit_code(self) -> int:
        """1: a culprit, or ranks left no positions (aborted, never dumped); 2: nothing, or not all of the live
        ranks, could be compared; 0: every rank's sequence was seen and they agree."""
        if self.culprits:
            return 1
        if self.missing:
            return 1 if self.compared else 2
        return 2 if self.unanswered else 0

    @property
    def culprits(self):
        return self.verdict.culprits

    @property
    def compared(self) -> bool:
        """True when at least one collective of one group was there to compare."""
        return any(group.rows and any(row["ranks"] for row in group.rows) for group in self.verdict.groups)

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in ("run", "job_id", "live", "requested", "answered", "ranks", "notes",
                                               "missing", "groups_seen", "unanswered")}
        data.update(self.verdict.to_dict())
        data["compared"] = self.compared
        if not self.culprits and self.missing:
            data["summary"] = "not enough data: " + "; ".join(self.missing)
        elif not self.culprits and self.unanswered:
            data["summary"] = unanswered_text(self.unanswered)
        data["exit_code"] = self.exit_code
        return data


def unanswered_text(ranks: list[int]) -> str:
    return (f"cannot tell: rank(s) {', '.join(map(str, ranks))} did not answer the dump request in time and their "
            f"newest positions are older than the rows shown; run again with a longer --wait")


def request_dump(wait: float = 4.0, *, home: Path | str | None = None,
                 limit: int | None = None) -> tuple[str | None, float]:
    """Ask every instrumented worker to dump its collectives (control key); returns (request id, time).

    ``limit``: entries per group each dump holds (default: what this module reads; see ``model.entries_asked``).
    """
    import ray

    request_id, asked_at = uuid.uuid4().hex[:12], time.time()
    request: dict[str, Any] = {"id": request_id, "time": asked_at}
    if limit is not None:
        request["limit"] = int(limit)
    try:
        writer = get_writer(create=False, home=home)
        ray.get(writer.set_control.remote(CONTROL_KEY, request), timeout=10)
    except Exception:
        return None, asked_at
    return request_id, asked_at


def _alive_processes() -> set | None:
    try:
        return {(w.ip, w.pid) for w in cluster.workers(alive_only=True)} | \
               {(None, w.pid) for w in cluster.workers(alive_only=True)}
    except Exception:
        return None


def read_collectives(store, job: str | None = None) -> list[dict[str, Any]]:
    """The newest dump of every worker, its newest :data:`~raysleuth.collectives.model.ENTRIES_PER_GROUP`
    entries per group (a dump an older raysleuth wrote held 256).

    Each dump holds its worker's newest entries per group, so older dumps add nothing newer; a
    mismatch further back than that is not looked for (the newest entries already disagree then).
    The dumps are parsed a few at a time and cut as they are read (``reading.tail_records``): a thousand
    180 KB dumps are never all in memory.
    """
    return _read_dumps(store, job)[0]


def _read_dumps(store, job: str | None, taken: dict[int, Any] | None = None,
                ) -> tuple[list[dict[str, Any]], list[evidence.Collectives]]:
    """:func:`read_collectives`, and each record read as a dump (its fields checked once).

    ``taken``: filled, as each dump is read, with its entries (:func:`~raysleuth.collectives.model.entries_from_dump`,
    by ``id`` of its dump, for :func:`positions_from_dumps`), whose parsed arrays are then dropped from the dump and
    its record: a thousand dumps' arrays (about 270 MB of dicts) are never all alive at once. A dump whose entries
    the writer took out at ingest (``recorder.compact``) is not parsed here: its entries and the rest of its data
    come from there (0.65 s -> 0.1 s for a 1,000-rank hour's newest dumps).
    """
    records, dumps = [], []
    with bulk(), blocks.snapshot(store):  # the ids, the entries taken out and the dumps of one state of the file
        ids = newest_per_worker(store, "collectives")[-RECORD_LIMIT:]
        stored = compact.read(store, ids, COLUMNS) if taken is not None else {}  # all that is wanted: entries
        parsed = tail_records(store, [i for i in ids if i not in stored], COLUMNS, compact.ARRAYS, ENTRIES_PER_GROUP)
        for record in _in_order(parsed, stored):
            dump = evidence.Collectives.from_record_dict(record)
            if taken is not None:
                body = stored.get(record["id"])
                entries = compact.entries_of(body[1]) if body is not None else entries_from_dump(dump.raw)
                dump = _without_arrays(dump)
                taken[id(dump)] = entries
            records.append(record)
            dumps.append(dump)
    job = job if job is not None else newest_job(dumps)
    kept = [k for k, dump in enumerate(dumps) if job is None or dump.job_id in (None, job)]
    return [records[k] for k in kept], [dumps[k] for k in kept]


def _in_order(parsed: Iterator[dict[str, Any]], stored: dict[int, tuple[dict[str, Any], dict[str, Any]]],
              ) -> Iterator[dict[str, Any]]:
    """The records ``tail_records`` gives (``parsed``) and those of the taken entries (``stored``), in (time, id)
    order, as ``tail_records`` alone gives every one."""
    yield from heapq.merge(sorted((record for record, _ in stored.values()), key=_time_and_id), parsed,
                           key=_time_and_id)


def _time_and_id(record: dict[str, Any]) -> tuple:
    return record["time"], record["id"]


def stored_verdict(store, job: str | None = None) -> CollectiveVerdict | None:
    """The matcher's verdict (default options) on a stored run's newest dumps, read as ``collectives --run`` reads
    them: one dump's entries taken at a time, no collector walks (None: the run holds no dump of that job)."""
    with bulk():
        taken: dict[int, Any] = {}
        _, dumps = _read_dumps(store, job, taken)
        if not dumps:
            return None
        return match(positions_from_dumps(dumps, job=job, taken=taken))


def _without_arrays(dump: evidence.Collectives) -> evidence.Collectives:
    """The dump, and its record's data, without the parsed calls and Flight Recorder entries (once taken)."""
    dump.raw.pop("calls", None)
    recorder = dump.raw.get("flight_recorder")
    if isinstance(recorder, dict):
        recorder.pop("entries", None)
    return dataclasses.replace(dump, calls=(), flight_recorder=recorder if isinstance(recorder, dict) else None)


def collect_collectives(address: str | None = None, *, run: str | None = None, home: Path | str | None = None,
                        request: bool = True, wait: float = 4.0, job: str | None = None, group: str | None = None,
                        last: int = 8, pending_after: float = PENDING_AFTER) -> CollectivesReport:
    """Align the collectives of every rank and name the ranks that broke the sequence.

    Without ``run``: connects to the cluster, asks live workers for a dump and
    waits up to ``wait`` seconds for their answers. With ``run``: reads that
    stored run only (works after the cluster is gone).
    """
    live, notes, request_id = run is None, [], None
    if live:
        cluster.connect(address)
        run = cluster.session_name()
    store = open_store(run, home=home)
    with bulk():  # a thousand dumps' entries stay alive until the verdict: nothing for the collector to walk
        try:
            answered: set[int] = set()
            if live and request:
                request_id, asked_at = request_dump(wait, home=home)
                if request_id is None:
                    notes.append("could not reach raysleuth's writer to ask for a dump; using stored dumps")
                else:
                    answered = _wait_for_answers(store, request_id, asked_at, wait, job)
            taken: dict[int, Any] = {}
            records, dumps = _read_dumps(store, job, taken)
        finally:
            store.close()
        alive = _alive_processes() if live else None
        positions = positions_from_dumps(dumps, alive=alive, job=job, taken=taken)
        verdict = match(positions, pending_after=pending_after, last=last, group=group)
    if records and live and request_id and positions and not answered:
        notes.append(f"no worker answered the dump request within {wait:.0f}s; positions are from earlier dumps")
    if positions and any(dump.detail is False for dump in dumps):
        notes.append(LIGHT_NOTE)
    job_id = job or newest_job(dumps)
    ranks = [{"rank": p.rank, "pid": p.pid, "node_ip": p.node_ip, "alive": p.alive, "dumped_at": p.dumped_at}
             for p in positions]
    seen = sorted({str(info.get("desc") or name) if info.get("desc") not in (None, "", "undefined") else name
                   for p in positions for name, info in p.group_info.items()} | {g for p in positions for g in p.groups})
    report = CollectivesReport(run=run, job_id=job_id, live=live, requested=request_id is not None,
                               answered=sorted(answered), ranks=ranks, verdict=verdict, notes=notes, groups_seen=seen)
    report.missing, report.unanswered = missing_data(report, bool(records), group)
    return report


LIGHT_NOTE = ("light mode (the default) records no file:line or shapes per call: a call still running when its rank "
              "dumped has its file:line (from that rank's stack), shapes come from torch's Flight Recorder where it is "
              "on; `raysleuth stacks` shows where every rank is now, `raysleuth run --mode full` records both per call")

#: How to get positions for every rank, whatever mode the job ran in.
_HOW = ("run the job under `raysleuth run --mode full` (every rank dumps its collectives each second, so a rank "
        "gloo aborts leaves its last positions), or ask the live cluster: `raysleuth collectives` while it hangs")


def missing_data(report: CollectivesReport, had_records: bool, group: str | None) -> tuple[list[str], list[int]]:
    """What was not there to compare (pure): no records, no entries, an unknown --pg, ranks that never dumped;
    and the live ranks absent from the rows shown only because they did not answer this request in time."""
    if not had_records:
        return [f"no collectives records in this run: {_HOW}"], []
    if group is not None and not report.verdict.groups:
        return [f"no process group {group!r} in the records (groups seen: "
                f"{', '.join(report.groups_seen) or 'none'})"], []
    if not report.compared:
        return [f"the records hold no collective entries to compare (light mode dumps only on request and at exit): "
                f"{_HOW}"], []
    missing: list[str] = []
    unanswered: set[int] = set()
    # not known dead (alive, or the State API did not say) and silent this time: cannot tell, never "gone"
    maybe_alive = {item["rank"] for item in report.ranks if item.get("alive") is not False}
    late = maybe_alive - set(report.answered) if report.live and report.requested else set()
    for item in report.verdict.groups:
        # a rank that answered with entries is not silent, though its dump, taken a moment before its peers'
        # in a fast job, holds none of the newest rows shown
        silent = [rank for rank in item.ranks if not any(rank in row["ranks"] for row in item.rows)
                  and not (rank in report.answered and item.last.get(rank))]
        unanswered.update(rank for rank in silent if rank in late)
        gone = [rank for rank in silent if rank not in late]
        if gone:
            missing.append(f"{item.label}: rank(s) {', '.join(map(str, gone))} left no positions (a process gloo "
                           f"aborted, or one that never dumped): {_HOW}")
    return missing, sorted(unanswered)


def _wait_for_answers(store, request_id: str, asked_at: float, wait: float, job: str | None) -> set[int]:
    """Poll the store until every process that dumped before answered (or ``wait`` passes)."""
    deadline = time.monotonic() + wait
    alive = _alive_processes() or set()
    answered: set[int] = set()
    while True:
        records = read_collectives(store, job)
        expected = {(r.get("node_ip"), r.get("pid")) for r in records} & alive
        dumps = [evidence.Collectives.from_record_dict(r) for r in records]
        got = {(d.row.node_ip, d.row.pid) for d in dumps if (d.request or {}).get("id") == request_id}
        answered = {d.rank for d in dumps if (d.request or {}).get("id") == request_id and d.rank is not None}
        if (expected and expected <= got) or time.monotonic() >= deadline:
            return answered
        time.sleep(0.3)
