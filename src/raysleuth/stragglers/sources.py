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

from raysleuth import evidence
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


def _time(dump: evidence.Collectives) -> float:
    """When a record was dumped (its data's time, else the row's); 0 when neither is a number."""
    return dump.time if dump.time is not None else float(dump.row.time or 0.0)


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _dumps(records: Iterable[Any]) -> list[evidence.Collectives]:
    """``collectives`` records (evidence, or store rows as dicts) as :class:`evidence.Collectives`."""
    dumps = [r if isinstance(r, evidence.Collectives) else evidence.Collectives.from_record_dict(r)
             for r in records if isinstance(r, evidence.Collectives | dict)]
    return [dump for dump in dumps if dump.raw]  # a row whose data is not an object is no dump


def newest_job(records: Iterable[Any]) -> str | None:
    """The job of the newest record (a run may hold several jobs' collectives)."""
    newest = max(_dumps(records), key=_time, default=None)
    return newest.job_id if newest else None


def calls_from_records(records: Iterable[Any], job: str | None = None) -> RankCalls:
    """Every rank's collective calls from ``collectives`` records (evidence, or store rows as dicts), for one job."""
    dumps = _dumps(records)
    job = job if job is not None else newest_job(dumps)
    dumps = [d for d in dumps if job is None or d.job_id in (None, job)]
    merged: dict[str, dict[int, dict[tuple, Call]]] = {WRAPPER: defaultdict(dict), FLIGHT_RECORDER: defaultdict(dict)}
    nodes, pids, node_ids = {}, {}, {}
    for dump in sorted(dumps, key=_time):
        rank = dump.rank if dump.rank is not None else dump.row.rank
        if rank is None:
            continue
        nodes[rank], node_ids[rank] = dump.row.node_ip, dump.row.node_id
        pid = dump.pid or dump.row.pid
        if pid is not None:
            pids[rank] = pid
        for entry in dump.calls:
            call = _wrapper_call(entry)
            if call is not None:
                merged[WRAPPER][rank][(call.group, call.seq)] = call
        for entry in _list(dump.flight_recorder.get("entries")) if dump.flight_recorder else []:
            call = _flight_call(entry)
            if call is not None:
                merged[FLIGHT_RECORDER][rank][(call.group, call.seq)] = call
    calls, sources = _choose(merged)
    return RankCalls(calls=calls, sources=sources, nodes=nodes, pids=pids, node_ids=node_ids, job_id=job,
                     records=len(dumps))


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
