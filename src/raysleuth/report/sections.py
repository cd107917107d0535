"""Turn a run's records into the report's sections: pure functions over :class:`Record` lists.

Each builder takes the records of one kind (as read from the evidence store)
and returns plain data (dicts, lists, numbers) that the template renders and
the charts plot. Nothing here touches Ray, SQLite or the file system, so the
builders are unit tested on hand-made records.

The evidence kinds are written by other features; their ``data`` layouts may
grow. Builders read the fields they know and keep the rest as JSON, so a new
field never breaks a report.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from raysleuth.recorder.store import Record

__all__ = [
    "collective_section",
    "consistency_section",
    "crash_section",
    "doctor_section",
    "log_section",
    "memory_section",
    "pick",
    "rank_label",
    "span_section",
    "stack_section",
    "summary_section",
    "task_section",
]

#: How much longer than the median a rank's step must take to count as a straggler.
STRAGGLER_RATIO = 1.5
#: Steps shorter than this are never called straggling (noise on tiny steps).
STRAGGLER_MIN_SECONDS = 0.05


def pick(data: dict[str, Any] | None, *keys: str, default: Any = None) -> Any:
    """The first of ``keys`` present (and not ``None``) in ``data``; dotted keys descend."""
    if not isinstance(data, dict):
        return default
    for key in keys:
        value: Any = data
        for part in key.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            else:
                value = None
                break
        if value is not None:
            return value
    return default


def rank_label(rank: int | None) -> str:
    """``rank 3``, or ``no rank`` (driver, agents)."""
    return "no rank" if rank is None else f"rank {rank}"


def _pretty(value: Any, limit: int = 4000) -> str:
    text = json.dumps(value, indent=2, default=repr, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "\n… (cut)"


def summary_section(records_by_kind: dict[str, int], meta: dict[str, Any], sample: Sequence[Record]) -> dict[str, Any]:
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


def doctor_section(records: Sequence[Record]) -> dict[str, Any] | None:
    """The newest doctor report: its checks (status, name, node, detail, fix) and verdict."""
    if not records:
        return None
    newest = max(records, key=lambda r: r.time)
    data = newest.data
    checks = [
        {"status": c.get("status", "?"), "name": c.get("name", "?"), "node": c.get("node") or "",
         "detail": c.get("detail") or "", "fix": c.get("fix") or ""}
        for c in data.get("checks", []) if isinstance(c, dict)
    ]
    return {"time": newest.time, "ok": bool(data.get("ok", True)), "counts": data.get("counts", {}),
            "checks": checks, "reports": len(records)}


def _culprits(data: dict[str, Any]) -> list[dict[str, Any]]:
    verdict = pick(data, "verdict", default={}) or {}
    culprits = verdict.get("culprits", []) if isinstance(verdict, dict) else []
    out = []
    for culprit in culprits or []:
        if isinstance(culprit, dict):
            out.append({"rank": culprit.get("rank"), "pid": culprit.get("pid"),
                        "reason": culprit.get("reason") or culprit.get("why") or ""})
    return out


def stack_section(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Each stack report (newest first): its verdict, culprits and stack groups."""
    out = []
    for record in sorted(records, key=lambda r: r.time, reverse=True):
        data = record.data
        verdict = pick(data, "verdict", default={}) or {}
        groups = []
        for group in pick(data, "groups", default=[]) or []:
            if not isinstance(group, dict):
                continue
            frames = group.get("frames") or group.get("stack") or []
            lines = []
            for frame in frames if isinstance(frames, list) else []:
                if isinstance(frame, dict):
                    where = f"{frame.get('filename') or frame.get('file') or '?'}:{frame.get('line') or frame.get('lineno') or '?'}"
                    lines.append(f"{frame.get('function') or frame.get('name') or '?'}  ({where})")
                else:
                    lines.append(str(frame))
            members = group.get("ranks") or group.get("pids") or group.get("members") or []
            if group.get("ranks"):
                members = [f"rank {rank}" for rank in members]
            groups.append({
                "count": group.get("count") or (len(members) if isinstance(members, list) else None),
                "members": members if isinstance(members, list) else [members],
                "summary": group.get("headline") or group.get("summary") or group.get("signature") or "",
                "frames": lines[-12:],
            })
        out.append({
            "time": record.time,
            "summary": (verdict.get("summary") or verdict.get("text") or "") if isinstance(verdict, dict) else str(verdict),
            "culprits": _culprits(data),
            "groups": groups,
            "missing": pick(data, "missing", "errors", default=[]) or [],
            "raw": _pretty(data) if not groups else None,
        })
    return out


def task_section(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Task evidence: one row per task (name, state, reason, resources), newest report first."""
    rows = []
    for record in sorted(records, key=lambda r: r.time, reverse=True):
        data = record.data
        items = pick(data, "tasks", "pending", default=None)
        for item in (items if isinstance(items, list) else [data]):
            if not isinstance(item, dict):
                continue
            rows.append({
                "time": record.time,
                "name": item.get("name") or item.get("func_or_class_name") or record.name or "?",
                "state": item.get("state") or "",
                "reason": item.get("reason") or "",
                "detail": item.get("detail") or item.get("explanation") or item.get("message") or "",
                "resources": item.get("required_resources") or item.get("resources") or {},
            })
    return rows[:200]


def collective_section(records: Sequence[Record]) -> dict[str, Any] | None:
    """Collective positions of the newest job: every rank's last collectives aligned, and the culprits."""
    if not records:
        return None
    from raysleuth.collectives import match
    from raysleuth.collectives.model import positions_from_records

    verdict = match(positions_from_records([r if isinstance(r, dict) else r.to_dict() for r in records]))
    return {"summary": verdict.summary, "culprits": [c.to_dict() for c in verdict.culprits],
            "groups": [{"label": g.label, "name": g.name, "ranks": g.ranks, "rows": g.rows} for g in verdict.groups]}


def consistency_section(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Consistency checks: key, step, verdict, and each mismatching tensor with its outlier ranks."""
    out = []
    for record in sorted(records, key=lambda r: (r.step if r.step is not None else -1, r.time)):
        data = record.data
        mismatches = []
        for mismatch in pick(data, "mismatches", default=[]) or []:
            if isinstance(mismatch, dict):
                mismatches.append({
                    "name": mismatch.get("name") or mismatch.get("tensor") or "?",
                    "outlier_ranks": mismatch.get("outlier_ranks") or [],
                    "first_index": mismatch.get("first_index"),
                    "detail": mismatch.get("detail") or mismatch.get("reason") or mismatch.get("kind") or "",
                    "max_abs_diff": mismatch.get("max_abs_diff"),
                })
        consistent = pick(data, "consistent")
        out.append({
            "time": record.time,
            "key": pick(data, "key", default=record.name) or "",
            "step": record.step if record.step is not None else pick(data, "step"),
            "rank": record.rank,
            "consistent": bool(consistent) if consistent is not None else not mismatches,
            "ranks": pick(data, "ranks", "members", default=[]) or [],
            "missing": pick(data, "missing_ranks", "missing", default=[]) or [],
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


_RSS_KEYS = ("rss_bytes", "rss", "uss_bytes", "uss", "memory_bytes", "bytes", "rss_mb")


def _rss_mb(data: dict[str, Any]) -> float | None:
    for key in _RSS_KEYS:
        value = pick(data, key, f"process.{key}", f"sample.{key}")
        if isinstance(value, (int, float)):
            return float(value) if key.endswith("_mb") else float(value) / 2**20
    return None


def memory_section(records: Sequence[Record]) -> dict[str, Any]:
    """Per-rank memory curves (seconds since the first sample → MiB) and the leak verdicts."""
    curves: dict[str, dict[str, list[float]]] = {}
    verdicts = []
    start = min((r.time for r in records), default=0.0)
    for record in sorted(records, key=lambda r: r.time):
        data = record.data
        is_verdict = "leak" in data or "leaking" in data or "verdict" in data or (record.name or "").endswith("verdict")
        if is_verdict:
            leak = pick(data, "leak", "leaking", "verdict.leak")
            verdicts.append({
                "time": record.time,
                "rank": record.rank if record.rank is not None else pick(data, "rank"),
                "leak": bool(leak),
                "slope": pick(data, "slope_mb_per_min", "slope_bytes_per_s", "slope", "verdict.slope"),
                "reason": pick(data, "reason", "detail", "verdict.reason", default="") or "",
            })
            if _rss_mb(data) is None:
                continue
        samples = pick(data, "samples")
        points = samples if isinstance(samples, list) else [data]
        for point in points:
            if not isinstance(point, dict):
                continue
            mb = _rss_mb(point)
            if mb is None:
                continue
            when = point.get("time") if isinstance(point.get("time"), (int, float)) else record.time
            label = rank_label(record.rank if record.rank is not None else point.get("rank"))
            if record.pid:
                label += f" · pid {record.pid}"
            curve = curves.setdefault(label, {"x": [], "y": []})
            curve["x"].append(round(when - start, 3))
            curve["y"].append(round(mb, 2))
    return {"curves": dict(sorted(curves.items())), "verdicts": verdicts,
            "leaking_ranks": sorted({v["rank"] for v in verdicts if v["leak"] and v["rank"] is not None})}


def crash_section(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Crash capsules: rank, exception, message, where, traceback, locals, explanation."""
    out = []
    for record in sorted(records, key=lambda r: r.time):
        data = record.data
        if record.kind == "death":
            out.append(_death_entry(record))
            continue
        traceback = pick(data, "traceback", "formatted", "stack", default="")
        if isinstance(traceback, list):
            traceback = "".join(str(line) for line in traceback)
        frames = pick(data, "frames", default=[]) or []
        locals_ = pick(data, "locals", default=None)
        if locals_ is None and frames and isinstance(frames[-1], dict):
            locals_ = frames[-1].get("locals")
        out.append({
            "time": record.time,
            "rank": record.rank,
            "actor": record.actor_class or record.actor_name or "",
            "pid": record.pid,
            "node": record.node_ip or record.hostname or "",
            "exception": pick(data, "exception_type", "type", "exc_type", "error_type", default=record.name or "?"),
            "message": str(pick(data, "message", "exception_message", "error", default="")),
            "where": pick(data, "where", "method", "function", "location", default=""),
            "traceback": str(traceback)[-6000:],
            "locals": _pretty(locals_, 2000) if locals_ else "",
            "explanation": _explanation(data),
            "method": pick(data, "method", default="") or "",
            "capsule": pick(data, "capsule", "capsule_path", "path", default="") or "",
        })
    return out


def _death_entry(record: Record) -> dict[str, Any]:
    """A classified worker death (``raysleuth.deaths``) beside the capsules: cause, evidence, last moments."""
    data = record.data
    frames = "\n".join(f"  {frame.get('file')}:{frame.get('line')} in {frame.get('function')}"
                       for frame in data.get("stack") or [])
    lines = ["evidence:"] + [f"  · {line}" for line in data.get("evidence") or []]
    if frames:
        lines += ["Python stack (most recent call first):", frames]
    for name in ("last_stdout", "last_stderr"):
        if data.get(name):
            lines += [f"{name.removeprefix('last_')} (last lines):"] + [f"  {line}" for line in data[name][-5:]]
    return {
        "time": record.time, "rank": record.rank, "actor": data.get("actor_name") or data.get("actor_class") or "",
        "pid": record.pid, "node": record.node_ip or "", "exception": f"died: {data.get('cause', '?')}",
        "message": str(data.get("summary", "")), "where": data.get("function") or data.get("task") or "",
        "traceback": "\n".join(lines)[-6000:], "locals": "", "explanation": str(data.get("fix") or ""),
        "method": data.get("task") or "", "capsule": "", "kind": "death",
    }


def _explanation(data: dict[str, Any]) -> str:
    explanations = data.get("explanations")
    if isinstance(explanations, list) and explanations and isinstance(explanations[0], dict):
        first = explanations[0]
        text = f"{first.get('title', '')}: {first.get('cause', '')}"
        return text + (f" Fix: {first['fix']}" if first.get("fix") else "")
    return str(pick(data, "cause", "explanation", "hint", default="") or "")


def log_section(records: Sequence[Record], *, per_rank: int = 50) -> dict[str, list[dict[str, Any]]]:
    """Warning and error log lines, grouped by rank (the newest ``per_rank`` of each)."""
    by_rank: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in sorted(records, key=lambda r: r.time):
        level = (record.level or record.data.get("level") or "").upper()
        if level not in {"WARNING", "ERROR", "CRITICAL"}:
            continue
        by_rank[rank_label(record.rank)].append({
            "time": record.time, "level": level, "logger": record.name or record.data.get("logger") or "",
            "message": str(pick(record.data, "message", "msg", "text", default=""))[:2000],
            "step": record.step,
        })
    return {rank: lines[-per_rank:] for rank, lines in sorted(by_rank.items())}


def span_section(records: Sequence[Record]) -> dict[str, Any]:
    """Per-step phase durations per rank, and the stragglers.

    Only top-level spans with a step count (nested spans would count their
    time twice). For each step, a rank whose total is more than
    :data:`STRAGGLER_RATIO` times the median of the ranks (and above
    :data:`STRAGGLER_MIN_SECONDS`) is a straggler.
    """
    # step -> rank -> phase -> seconds
    table: dict[int, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    phases: set[str] = set()
    for record in records:
        if record.step is None or record.rank is None:
            continue
        if record.data.get("parent_id"):
            continue
        duration = record.data.get("duration_s")
        if not isinstance(duration, (int, float)):
            continue
        phase = record.name or record.phase or "?"
        phases.add(phase)
        table[record.step][record.rank][phase] += float(duration)
    steps = sorted(table)
    ranks = sorted({rank for step in table.values() for rank in step})
    totals = {rank: [round(sum(table[step][rank].values()), 4) if rank in table[step] else None for step in steps]
              for rank in ranks}
    mean_phase = {
        rank: {phase: round(statistics.fmean([table[s][rank][phase] for s in steps if rank in table[s]] or [0.0]), 4)
               for phase in sorted(phases)}
        for rank in ranks
    }
    stragglers = []
    for index, step in enumerate(steps):
        values = {rank: totals[rank][index] for rank in ranks if totals[rank][index] is not None}
        if len(values) < 2:
            continue
        median = statistics.median(values.values())
        for rank, value in values.items():
            if value > STRAGGLER_MIN_SECONDS and median > 0 and value > STRAGGLER_RATIO * median:
                stragglers.append({"step": step, "rank": rank, "seconds": value, "median": round(median, 4),
                                   "ratio": round(value / median, 2)})
    return {"steps": steps, "ranks": ranks, "phases": sorted(phases), "totals": totals,
            "mean_phase": mean_phase, "stragglers": stragglers}


def group_by_kind(records: Iterable[Record]) -> dict[str, list[Record]]:
    """Records grouped by kind."""
    out: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        out[record.kind].append(record)
    return out
