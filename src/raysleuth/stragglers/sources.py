"""Each rank's collective enter times, from stored ``collectives`` records (pure).

Two sources, per process group, whichever holds more collectives that
every rank entered (the wrapper on a tie):

- **the collective wrapper** (``calls``: pg, seq, op, start_ns, end_ns, file,
  line): the job's own ``torch.distributed`` calls, with their exits;
- **torch's Flight Recorder** (``flight_recorder.entries``: process_group,
  collective_seq_id, profiling_name, time_created_ns): every collective the
  process group issued, DDP's gradient buckets included (the wrapper does
  not see those: DDP calls the process group from C++). No exits.

A rank's dumps are merged (the newest wins per ``(group, seq)``); records of
other jobs are left out.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any, Iterable

from raysleuth.stragglers.analysis import Call, StragglerReport, complete_collectives, find_stragglers

WRAPPER, FLIGHT_RECORDER = "wrapper", "flight recorder"


@dataclasses.dataclass
class RankCalls:
    """What the records say: every rank's calls (chosen source per group), and who each rank is."""

    calls: dict[int, list[Call]]
    sources: dict[str, str]
    """group -> the source used"""
    nodes: dict[int, str | None]
    pids: dict[int, int]
    node_ids: dict[int, str | None]
    job_id: str | None
    records: int

    @property
    def source(self) -> str | None:
        used = set(self.sources.values())
        return " + ".join(sorted(used)) if used else None


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _wrapper_call(entry: Any) -> Call | None:
    if not isinstance(entry, dict) or entry.get("state") == "error":
        return None
    seq, start = _int(entry.get("seq")), _int(entry.get("start_ns"))
    if seq is None or start is None:
        return None
    file, line, op = entry.get("file"), _int(entry.get("line")), entry.get("op")
    return Call(group=str(entry.get("pg")), seq=seq, enter_ns=start, exit_ns=_int(entry.get("end_ns")),
                op=op if isinstance(op, str) else None, file=file if isinstance(file, str) else None, line=line,
                function=entry.get("function") if isinstance(entry.get("function"), str) else None,
                site=(file, line, op) if file else None)


def _flight_call(entry: Any) -> Call | None:
    if not isinstance(entry, dict) or entry.get("is_p2p"):
        return None
    seq, created = _int(entry.get("collective_seq_id")), _int(entry.get("time_created_ns"))
    group = entry.get("process_group")
    if seq is None or created is None:
        return None
    name = str(group[0]) if isinstance(group, (list, tuple)) and group else str(group)
    op = str(entry.get("profiling_name") or "collective").split(":")[-1]
    return Call(group=name, seq=seq, enter_ns=created, op=op, site=(op, str(entry.get("input_sizes"))))


def _time(record: dict[str, Any]) -> float:
    """When a record was dumped (its data's time, else the row's); 0 when neither is a number."""
    for value in (record["data"].get("time"), record.get("time")):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.0


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def newest_job(records: list[dict[str, Any]]) -> str | None:
    """The job of the newest record (a run may hold several jobs' collectives)."""
    newest = max(records, key=_time, default=None)
    job = newest["data"].get("job_id") if newest else None
    return job if isinstance(job, str) else None


def _rank_of(record: dict[str, Any]) -> int | None:
    data = record.get("data")
    rank = _int(data.get("rank")) if isinstance(data, dict) else None
    return rank if rank is not None else _int(record.get("rank"))


def calls_from_records(records: Iterable[dict[str, Any]], job: str | None = None) -> RankCalls:
    """Every rank's collective calls from ``collectives`` records (store rows as dicts), for one job."""
    records = [r for r in records if isinstance(r, dict) and isinstance(r.get("data"), dict)]
    job = job if job is not None else newest_job(records)
    records = [r for r in records if job is None or r["data"].get("job_id") in (None, job)]
    merged: dict[str, dict[int, dict[tuple, Call]]] = {WRAPPER: defaultdict(dict), FLIGHT_RECORDER: defaultdict(dict)}
    nodes, pids, node_ids = {}, {}, {}
    for record in sorted(records, key=_time):
        rank = _rank_of(record)
        if rank is None:
            continue
        nodes[rank], node_ids[rank] = record.get("node_ip"), record.get("node_id")
        pid = _int(record["data"].get("pid")) or _int(record.get("pid"))
        if pid is not None:
            pids[rank] = pid
        for entry in _list(record["data"].get("calls")):
            call = _wrapper_call(entry)
            if call is not None:
                merged[WRAPPER][rank][(call.group, call.seq)] = call
        flight = record["data"].get("flight_recorder")
        for entry in _list(flight.get("entries")) if isinstance(flight, dict) else []:
            call = _flight_call(entry)
            if call is not None:
                merged[FLIGHT_RECORDER][rank][(call.group, call.seq)] = call
    calls, sources = _choose(merged)
    return RankCalls(calls=calls, sources=sources, nodes=nodes, pids=pids, node_ids=node_ids, job_id=job,
                     records=len(records))


def _choose(merged: dict[str, dict[int, dict[tuple, Call]]]) -> tuple[dict[int, list[Call]], dict[str, str]]:
    """Per group, the source with more complete collectives (the wrapper on a tie)."""
    by_group: dict[str, dict[str, dict[int, list[Call]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for source, ranks in merged.items():
        for rank, calls in ranks.items():
            for call in calls.values():
                by_group[call.group][source][rank].append(call)
    chosen_calls: dict[int, list[Call]] = defaultdict(list)
    sources = {}
    for group, per_source in by_group.items():
        counts = {source: len(complete_collectives(ranks)) for source, ranks in per_source.items()}
        chosen = max((WRAPPER, FLIGHT_RECORDER), key=lambda s: (counts.get(s, -1), s == WRAPPER))
        sources[group] = chosen
        for rank, rank_calls in per_source.get(chosen, {}).items():
            chosen_calls[rank].extend(sorted(rank_calls, key=lambda c: c.seq))
    return dict(chosen_calls), sources


def stragglers_from_records(records: Iterable[dict[str, Any]], job: str | None = None, **rule: Any) -> StragglerReport:
    """:func:`~raysleuth.stragglers.analysis.find_stragglers` on stored ``collectives`` records (one job).

    ``rule``: ``threshold``, ``min_collectives``, ``min_share``, ``since_ns``,
    ``step_seconds`` as there. What the stacks verdict calls to tell a busy
    job with one late rank from a hung one.
    """
    calls = calls_from_records(records, job)
    report = find_stragglers(calls.calls, nodes=calls.nodes, pids=calls.pids, source=calls.source, **rule)
    report.job_id = calls.job_id
    return report
