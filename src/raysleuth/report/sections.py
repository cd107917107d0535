"""Turn a run's evidence into the report's sections: pure functions over :mod:`raysleuth.evidence` objects.

Each builder takes the typed records of its kinds (``evidence.read``) and
returns plain data (dicts, lists, numbers) that the template renders and
the charts plot. Nothing here touches Ray, SQLite or the file system, so
the builders are unit tested on hand-made evidence. A stored row another
writer left reads with defaults (:mod:`raysleuth.evidence.base`), so a new
or missing field never breaks a report.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from raysleuth.collectives import match
from raysleuth.collectives.model import CollectiveVerdict, positions_from_records
from raysleuth.evidence import Consistency, Crash, Death, DoctorRun, Log, StackRun, TasksRun
from raysleuth.logs.aggregate import split_template
from raysleuth.options import format_ranks
from raysleuth.recorder.schema import SEVERE_LEVELS
from raysleuth.recorder.totals import totals_arrays
from raysleuth.report.step_arrays import span_arrays
from raysleuth.timeline.summary import phases_from_totals, stragglers_of

__all__ = [
    "collective_section",
    "verdict_section",
    "consistency_section",
    "crash_section",
    "doctor_section",
    "log_section",
    "rank_label",
    "span_section",
    "stack_section",
    "summary_section",
    "task_section",
]


def rank_label(rank: int | None) -> str:
    """``rank 3``, or ``no rank`` (driver, agents)."""
    return "no rank" if rank is None else f"rank {rank}"


def _pretty(value: Any, limit: int = 4000) -> str:
    text = json.dumps(value, indent=2, default=repr, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "\n… (cut)"


def summary_section(records_by_kind: dict[str, int], meta: dict[str, Any], sample: Sequence[Any]) -> dict[str, Any]:
    """The run at a glance: id, time span, ranks, nodes, how much evidence of each kind."""
    ranks = sorted({r.rank for r in sample if r.rank is not None})
    nodes = sorted({r.node_ip or r.hostname or "?" for r in sample if (r.node_ip or r.hostname)})
    times = [r.time for r in sample]
    return {
        "run_id": meta.get("run_id"),
        "kinds": dict(sorted(records_by_kind.items())),
        "total": sum(records_by_kind.values()),
        "ranks": ranks,
        "nodes": nodes,
        "start": min(times) if times else None,
        "end": max(times) if times else None,
        "seconds": (max(times) - min(times)) if times else 0.0,
        "actor_classes": sorted({r.actor_class for r in sample if r.actor_class}),
    }


def doctor_section(records: Sequence[DoctorRun]) -> dict[str, Any] | None:
    """The newest doctor report: its checks (status, name, node, detail, fix) and verdict."""
    if not records:
        return None
    newest = max(records, key=lambda r: r.row.time)
    checks = [{"status": c.status, "name": c.name, "node": c.node or "", "detail": c.detail or "", "fix": c.fix or ""}
              for c in newest.checks]
    return {"time": newest.row.time, "ok": newest.ok, "counts": newest.counts, "checks": checks,
            "reports": len(records)}


def stack_section(records: Sequence[StackRun]) -> list[dict[str, Any]]:
    """Each stack report (newest first): its verdict, culprits and stack groups."""
    out = []
    for record in sorted(records, key=lambda r: r.row.time, reverse=True):
        groups = []
        for group in record.groups:
            lines = [f"{frame.function or '?'}  ({frame.file or '?'}:{frame.line or '?'})"
                     if not isinstance(frame, str) else frame for frame in group.frames]
            members: list[Any] = [f"rank {rank}" for rank in group.ranks] if group.ranks else \
                list(group.pids or group.members)
            groups.append({"count": group.count or len(members), "members": members, "summary": group.headline or "",
                           "frames": lines[-12:]})
        out.append({
            "time": record.row.time,
            "summary": record.verdict.summary,
            "culprits": [{"rank": c.rank, "pid": c.pid, "reason": c.reason} for c in record.verdict.culprits],
            "groups": groups,
            "missing": list(record.missing),
            "raw": _pretty(record.raw) if not groups else None,
        })
    return out


def task_section(records: Sequence[TasksRun]) -> list[dict[str, Any]]:
    """Task evidence: one row per pending task (name, state, reason, resources), newest report first."""
    rows = []
    for record in sorted(records, key=lambda r: r.row.time, reverse=True):
        for item in record.pending:
            rows.append({"time": record.row.time, "name": item.name or record.row.name or "?", "state": item.state or "",
                         "reason": item.reason or "", "detail": item.detail or "",
                         "resources": item.required_resources})
    return rows[:200]


def collective_section(records: Sequence[Any]) -> dict[str, Any] | None:
    """Collective positions of the newest job: every rank's last collectives aligned, and the culprits."""
    if not records:
        return None
    return verdict_section(match(positions_from_records([r if isinstance(r, dict) else r.to_dict() for r in records])))


def verdict_section(verdict: CollectiveVerdict | None) -> dict[str, Any] | None:
    """:func:`collective_section` of a verdict already made (None: no dump)."""
    if verdict is None:
        return None
    return {"summary": verdict.summary, "culprits": [c.to_dict() for c in verdict.culprits],
            "groups": [{"label": g.label, "name": g.name, "ranks": g.ranks, "rows": g.rows,
                        "columns": [{"header": header, "rank": rank} for header, rank in g.headed_columns()]}
                       for g in verdict.groups]}


def consistency_section(records: Sequence[Consistency]) -> list[dict[str, Any]]:
    """Consistency checks: key, step, verdict, and each mismatching tensor with its outlier ranks."""
    out: list[dict[str, Any]] = []
    for record in sorted(records, key=lambda r: (r.row.step if r.row.step is not None else -1, r.row.time)):
        mismatches = [{"name": m.name, "outlier_ranks": list(m.outlier_ranks), "first_index": m.first_index,
                       "detail": m.detail or m.kind, "max_abs_diff": m.max_abs_diff} for m in record.mismatches]
        out.append({
            "time": record.row.time,
            "key": record.key or record.row.name or "",
            "step": record.row.step if record.row.step is not None else record.step,
            "rank": record.row.rank,
            "consistent": record.consistent if record.consistent is not None else not mismatches,
            "missing": list(record.missing_ranks),
            "mismatches": mismatches,
        })
    # Every rank may record the same check: keep one row per (key, step, verdict), preferring the lowest rank.
    seen: dict[tuple, dict[str, Any]] = {}
    for row in out:
        ident = (row["key"], row["step"], row["consistent"],
                 tuple(sorted(str(m["name"]) for m in row["mismatches"])))
        if ident not in seen:
            seen[ident] = row
    return list(seen.values())


def crash_section(records: Sequence[Crash | Death]) -> list[dict[str, Any]]:
    """Crash capsules and classified deaths: rank, exception, message, where, traceback, locals, explanation."""
    out = []
    for record in sorted(records, key=lambda r: r.row.time):
        if isinstance(record, Death):
            out.append(_death_entry(record))
            continue
        row = record.row
        locals_ = record.frames[-1].locals if record.frames else None
        out.append({
            "time": row.time,
            "rank": row.rank,
            "actor": row.actor_class or row.actor_name or "",
            "pid": row.pid,
            "node": row.node_ip or row.hostname or "",
            "exception": record.exception_type if "exception_type" in record.raw else (row.name or "?"),
            "message": record.message,
            "where": record.method or "",
            "traceback": record.traceback[-6000:],
            "locals": _pretty(locals_, 2000) if locals_ else "",
            "explanation": _explanation(record),
            "method": record.method or "",
            "capsule": "",
        })
    return out


def _death_entry(death: Death) -> dict[str, Any]:
    """A classified worker death (``raysleuth.deaths``) beside the capsules: cause, evidence, last moments."""
    frames = "\n".join(f"  {frame.file}:{frame.line} in {frame.function}" for frame in death.stack)
    lines = ["evidence:"] + [f"  · {line}" for line in death.evidence]
    if frames:
        lines += ["Python stack (most recent call first):", frames]
    for name, said in (("stdout", death.last_stdout), ("stderr", death.last_stderr)):
        if said:
            lines += [f"{name} (last lines):"] + [f"  {line}" for line in said[-5:]]
    return {
        "time": death.row.time, "rank": death.row.rank, "actor": death.actor_name or death.actor_class or "",
        "pid": death.row.pid, "node": death.row.node_ip or "", "exception": f"died: {death.cause}",
        "message": death.summary, "where": death.function or death.task or "",
        "traceback": "\n".join(lines)[-6000:], "locals": "", "explanation": death.fix or "",
        "method": death.task or "", "capsule": "", "kind": "death",
    }


def _explanation(crash: Crash) -> str:
    if crash.explanations:
        first = crash.explanations[0]
        text = f"{first.title or ''}: {first.cause or ''}"
        return text + (f" Fix: {first.fix}" if first.fix else "")
    return crash.cause or ""


#: Log levels the report shows, most severe first.
_SEVERITY = {level: order for order, level in enumerate(SEVERE_LEVELS)}  # CRITICAL 0, ERROR 1, WARNING 2


def log_section(records: Sequence[Log], *, per_rank: int = 50) -> dict[str, list[dict[str, Any]]]:
    """Warning and error log lines, grouped by rank (the newest ``per_rank`` of each)."""
    by_rank: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in sorted(records, key=lambda r: r.row.time):
        level = record.level
        if level not in _SEVERITY:
            continue
        by_rank[rank_label(record.row.rank)].append({
            "time": record.row.time, "level": level, "logger": record.logger,
            "message": record.message[:2000], "step": record.row.step,
        })
    return {rank: lines[-per_rank:] for rank, lines in sorted(by_rank.items())}


def log_groups(records: Sequence[Log], *, groups: int = 200, per_group: int = 20) -> dict[str, Any]:
    """Warning and error log lines of many ranks as groups of one message (its numbers masked, as ``raysleuth
    logs --aggregate`` reads them), level and logger: how many lines, which ranks (as ranges), when, and the
    newest ``per_group`` lines. Most severe first, then the groups of the fewest ranks (the odd ones out); at
    most ``groups`` (``left_out``: how many more), with the lines and ranks they hold in all."""
    found: dict[tuple, dict[str, Any]] = {}
    for record in sorted(records, key=lambda r: r.row.time):
        level = record.level
        if level not in _SEVERITY:
            continue
        message = record.message[:2000]
        key = (level, record.logger, split_template(message)[0])
        group = found.get(key)
        if group is None:
            group = found[key] = {"level": level, "logger": record.logger, "template": key[2], "count": 0,
                                  "ranks": set(), "unranked": 0, "first": record.row.time, "lines": []}
        group["count"] += 1
        if record.row.rank is None:
            group["unranked"] += 1
        else:
            group["ranks"].add(record.row.rank)
        group["last"] = record.row.time
        group["lines"].append({"time": record.row.time, "rank": record.row.rank, "step": record.row.step,
                               "message": message})
        if len(group["lines"]) > 2 * per_group:
            del group["lines"][:-per_group]
    ordered = sorted(found.values(), key=lambda g: (_SEVERITY[g["level"]], len(g["ranks"]), g["first"]))
    return {"groups": [dict(group, ranks=format_ranks(group["ranks"]), rank_count=len(group["ranks"]),
                            lines=group["lines"][-per_group:]) for group in ordered[:groups]],
            "left_out": max(0, len(ordered) - groups), "lines": sum(group["count"] for group in ordered),
            "ranks": len(set().union(*(group["ranks"] for group in ordered)))}


def span_section(totals: Iterable[tuple[int, int, str, float]]) -> dict[str, Any]:
    """Per-step phase durations per rank, and the stragglers, from (step, rank, phase, seconds) totals.

    The totals are of top-level spans (nested spans would count their time
    twice), summed per step, rank and phase. The stragglers are the
    timeline's (:func:`raysleuth.timeline.summary.stragglers_of`, the rule
    ``raysleuth timeline --summary`` marks): per step and phase, the slowest
    rank when it took at least 1.5× the median of the ranks.

    Totals as SQL hands them (``totals.span_totals``: one per step, rank and phase, in that order, whole numbers
    and finite seconds) are read as columns in numpy (:func:`_span_columns`); anything else row by row. Both give
    the same answer, to the bit.
    """
    totals = totals if isinstance(totals, list) else list(totals)
    section = _span_columns(totals)
    return section if section is not None else _span_rows(totals)


def _span_rows(totals: list[tuple]) -> dict[str, Any]:
    """:func:`span_section` a row at a time: any totals (repeated keys summed in order, foreign values skipped)."""
    table: dict[int, dict[int, dict[str, float]]] = {}  # step -> rank -> phase -> seconds
    phases: set[str] = set()
    for step, rank, phase, seconds in totals:
        if step is None or rank is None or type(seconds) not in (int, float):
            continue
        phases.add(phase)
        by_rank = table.get(step)
        if by_rank is None:
            by_rank = table[step] = {}
        by_phase = by_rank.get(rank)
        if by_phase is None:
            by_phase = by_rank[rank] = {}
        by_phase[phase] = by_phase.get(phase, 0.0) + float(seconds)
    steps = sorted(table)
    ranks = sorted({rank for step in table.values() for rank in step})
    step_totals: dict[Any, list[float | None]] = {rank: [] for rank in ranks}
    for step in steps:
        by_rank = table[step]
        for rank, column in step_totals.items():
            by_phase = by_rank.get(rank)
            column.append(None if by_phase is None else round(sum(by_phase.values()), 4))
    ordered = sorted(phases)
    for by_rank in table.values():  # a rank seen in a step spent 0 s in the phases it did not record there
        for by_phase in by_rank.values():
            if len(by_phase) < len(ordered):
                for phase in ordered:
                    by_phase.setdefault(phase, 0.0)
    mean_phase = {
        rank: {phase: round(statistics.fmean([table[s][rank][phase] for s in steps if rank in table[s]] or [0.0]), 4)
               for phase in ordered}
        for rank in ranks
    }
    rows = phases_from_totals((step, phase, rank, seconds) for step, by_rank in table.items()
                              for rank, by_phase in by_rank.items() for phase, seconds in by_phase.items())
    index = {step: number for number, step in enumerate(steps)}
    stragglers = [{"step": row.step, "rank": int(row.slowest), "phase": row.phase, "seconds": round(row.slowest_s, 4),
                   "median": round(row.median_s, 4), "ratio": round(row.lag_ratio, 2),
                   "step_seconds": step_totals[int(row.slowest)][index[row.step]]}
                  for row in stragglers_of(rows)]
    return {"steps": steps, "ranks": ranks, "phases": sorted(phases), "totals": step_totals,
            "mean_phase": mean_phase, "stragglers": stragglers}


def _span_columns(totals: list[tuple]) -> dict[str, Any] | None:
    """:func:`span_section` in numpy, or None when the totals are not SQL's shape (then :func:`_span_rows`).

    SQL's shape: int steps and ranks, str phases, finite int or float seconds, keys strictly increasing in
    (step, rank, phase), and steps shared by the ranks (a dense table at most 8 cells a total). Then each
    (step, rank)'s phases are summed in phase order, as the rows' loop adds them; means are ``fsum``'s, medians
    the middle (or the halved sum of the two middles), the slowest the first highest in rank order, and every
    figure is rounded by Python's ``round``: the rows' answer, bit for bit.
    """
    if not totals:
        return None
    arrays = totals_arrays(*zip(*totals))
    return span_arrays(*arrays) if arrays is not None else None
