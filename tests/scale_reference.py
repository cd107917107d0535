"""The readers as they were before the fast read path (issue 27), kept as oracles for tests/test_scale.py.

Each reads through ``EvidenceStore.query`` (a record per row, all its JSON
parsed), exactly as the code did; the tests check that the fast path answers
the same on the same store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from raysleuth.memory import trend
from raysleuth.memory.trend import LeakPolicy, LeakVerdict, detect_leak
from raysleuth.memory.series import _thin
from raysleuth.memory.workers import TREND_SOURCES, MemoryReport, WorkerMemory
from raysleuth.recorder import open_store
from raysleuth.timeline.model import Timeline, _label, _number, _Tracks, _us


def old_mann_kendall_s(values) -> int:
    """Every pair, as kendall_tau counted it."""
    ys = np.asarray(values, dtype=float)
    i, j = np.triu_indices(len(ys), k=1)
    return int(np.sign(ys[j] - ys[i]).sum())


def old_theil_sen(x, y, *, max_points: int = 300) -> tuple[float, float]:
    """Every pair's slope in fresh arrays, and numpy's median, as theil_sen counted them."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(xs) < 2:
        return 0.0, float(ys[0]) if len(ys) else 0.0
    if len(xs) > max_points:
        keep = np.linspace(0, len(xs) - 1, max_points).round().astype(int)
        xs, ys = xs[keep], ys[keep]
    i, j = np.triu_indices(len(xs), k=1)
    dx = xs[j] - xs[i]
    usable = dx != 0
    if not usable.any():
        return 0.0, float(np.median(ys))
    slope = float(np.median((ys[j] - ys[i])[usable] / dx[usable]))
    return slope, float(np.median(ys - slope * xs))


def old_summarise(records: list, policy: LeakPolicy | None = None) -> WorkerMemory:
    """One worker's :class:`WorkerMemory` from its ``memory`` records (one source, time order)."""
    last = records[-1]
    data = [r.data for r in records]
    rank = next((r.rank for r in reversed(records) if r.rank is not None), None)
    times = [r.time for r in records]
    steps = [r.step for r in records]
    worker = WorkerMemory(
        rank=rank, pid=last.data.get("pid", last.pid), node_ip=last.data.get("node_ip", last.node_ip),
        node_id=last.node_id, actor_class=last.actor_class, actor_name=last.actor_name,
        source=last.data.get("source"), samples=len(records), first_time=times[0], last_time=times[-1],
        rss_bytes=last.data.get("rss_bytes"), uss_bytes=last.data.get("uss_bytes"),
        cuda_allocated_bytes=last.data.get("cuda_allocated_bytes"),
        cuda_reserved_bytes=last.data.get("cuda_reserved_bytes"),
    )
    rss = [d.get("rss_bytes") for d in data if d.get("rss_bytes") is not None]
    worker.peak_bytes = max(rss) if rss else None
    cuda_peaks = [d.get("cuda_peak_bytes") for d in data if d.get("cuda_peak_bytes") is not None]
    worker.cuda_peak_bytes = max(cuda_peaks) if cuda_peaks else None
    uss_count = sum(1 for d in data if d.get("uss_bytes") is not None)
    host_metric = "uss_bytes" if uss_count >= len(data) / 2 else "rss_bytes"
    verdicts: list[LeakVerdict] = [
        detect_leak(times, [d.get(host_metric) for d in data], steps=steps, policy=policy, metric=host_metric)
    ]
    if any(d.get("cuda_allocated_bytes") is not None for d in data):
        verdicts.insert(0, detect_leak(times, [d.get("cuda_allocated_bytes") for d in data], steps=steps,
                                       policy=policy, metric="cuda_allocated_bytes"))
    chosen = next((v for v in verdicts if v.leak), verdicts[-1])
    worker.leak, worker.reason, worker.evidence = chosen.leak, chosen.reason, chosen.to_dict()
    worker.status = chosen.status
    worker.slope_bytes_per_s, worker.slope_bytes_per_step = chosen.slope_bytes_per_s, chosen.slope_bytes_per_step
    worker.series = _thin([d.get(chosen.metric) for d in data if d.get(chosen.metric) is not None])
    return worker


def old_memory_report(store, *, rank: int | list[int] | None = None, since: float | None = None,
                  job: str | list[str] | None = None, policy: LeakPolicy | None = None) -> MemoryReport:
    """Per-worker memory of a run (``store``: an open :class:`EvidenceStore`), sorted by rank.

    ``rank``, ``since`` (a Unix time) and ``job`` (a Ray job id) narrow the samples judged.
    """
    groups: dict[tuple[Any, Any], dict[str, list]] = {}
    for item in store.query("memory", rank=rank, since=since, job=job):
        source = item.data.get("source") or "watch"
        if source not in TREND_SOURCES:
            continue
        key = (item.data.get("node_ip", item.node_ip), item.data.get("pid", item.pid))
        groups.setdefault(key, {}).setdefault(source, []).append(item)
    workers = []
    for by_source in groups.values():
        records = max(by_source.values(), key=len)  # one source per worker: the denser one
        workers.append(old_summarise(records, policy))
    workers.sort(key=lambda w: (w.rank is None, w.rank if w.rank is not None else 0, w.node_ip or "", w.pid or 0))
    return MemoryReport(store=str(store.path), workers=workers)


def old_build_timeline(
    address: str | None = None,
    *,
    run: str | None = None,
    home: Path | str | None = None,
    steps: tuple[int | None, int | None] | None = None,
    ranks: list[int] | None = None,
    jobs: list[str] | None = None,
    ray_tasks: bool = True,
) -> Timeline:
    """Merge the run's spans, events and memory with Ray's task events into trace events.

    ``run``/``home`` pick the evidence store (default: the latest run).
    ``ray_tasks``: also read the State API (skipped, with a warning, when no
    cluster answers). ``steps`` (inclusive range), ``ranks`` and ``jobs`` (Ray
    job ids: a cluster shared by several jobs) bound it.
    """
    store = open_store(run, home=home)
    timeline = Timeline(events=[], run=store.path.parent.name)
    tracks = _Tracks()
    step_min, step_max = steps if steps else (None, None)
    records = store.query(["span", "event", "heartbeat"], rank=ranks, job=jobs, step_min=step_min, step_max=step_max)
    worker_ranks: dict[tuple[str | None, int | None], int] = {}
    window = [float("inf"), float("-inf")]
    for record in records:
        pid = tracks.pid(record.node_id, record.node_ip)
        tid = tracks.tid(pid, record.pid, _label(record.rank, record.actor_class, record.pid))
        if record.rank is not None:
            worker_ranks[(record.node_id, record.pid)] = record.rank
        data = record.data or {}
        if record.kind == "span":
            start = _number(data.get("start"), record.time)
            end = max(start, _number(data.get("end"), start))
            if not isinstance(data.get("attrs") or {}, dict):
                data = {**data, "attrs": {"attrs": data.get("attrs")}}
            window[0], window[1] = min(window[0], start), max(window[1], end)
            args = {"step": record.step, "rank": record.rank, "span_id": data.get("span_id"),
                    "parent_id": data.get("parent_id"), **(data.get("attrs") or {})}
            if data.get("error"):
                args["error"] = data["error"]
            name = record.name or "span"
            if name.startswith("ray.call:"):
                ident = f"{record.pid}-{data.get('span_id')}"
                base = {"name": name, "cat": "ray_call", "pid": pid, "tid": tid, "id": ident}
                timeline.events.append({**base, "ph": "b", "ts": _us(start), "args": args})
                timeline.events.append({**base, "ph": "e", "ts": _us(end), "args": {}})
            else:
                timeline.events.append({"name": name, "cat": "span", "ph": "X", "ts": _us(start),
                                        "dur": _us(max(0.0, end - start)), "pid": pid, "tid": tid, "args": args})
            timeline.spans += 1
        else:
            name = f"step {record.step}" if record.kind == "heartbeat" else (record.name or "event")
            timeline.events.append({"name": name, "cat": record.kind, "ph": "i", "s": "t", "ts": _us(record.time),
                                    "pid": pid, "tid": tid, "args": {"step": record.step, "rank": record.rank, **data}})
            timeline.instant_events += 1
    bounded = steps is not None and window[0] <= window[1]
    for sample in store.query("memory", rank=ranks, job=jobs):
        if bounded and not (window[0] <= sample.time <= window[1]):
            continue
        pid = tracks.pid(sample.node_id, sample.node_ip)
        data = sample.data or {}
        values = {key.removesuffix("_bytes") + "_mb": round(float(value) / 2**20, 2) for key, value in data.items()
                  if key.endswith("_bytes") and isinstance(value, (int, float))}
        if not values:
            continue
        who = f"rank {sample.rank}" if sample.rank is not None else f"pid {sample.pid}"
        timeline.events.append({"name": f"memory {who}", "cat": "memory", "ph": "C", "ts": _us(sample.time),
                                "pid": pid, "tid": 0, "args": values})
        timeline.memory_samples += 1
    timeline.events = tracks.metadata() + sorted(timeline.events, key=lambda event: event["ts"])
    return timeline


def old_timeline_summary_rows(store) -> list[dict[str, Any]]:
    """The spans timeline_summary read, as it read them."""
    return [{"step": record.step, "name": record.name, "rank": record.rank, "pid": record.pid,
             "duration_s": (record.data or {}).get("duration_s")} for record in store.query("span")]
def old_call_at(calls: list[dict], created_ns: int | None) -> dict | None:
    """The wrapper call during which torch created this Flight Recorder entry (the last one started before it)."""
    if not created_ns:
        return None
    slack = 2_000_000
    before = [c for c in calls if (c.get("start_ns") or 0) <= created_ns]
    if before:
        call = max(before, key=lambda c: c.get("start_ns") or 0)
        end = call.get("end_ns")
        if end is None or created_ns <= end + slack:
            return call
    near = [c for c in calls if abs((c.get("start_ns") or 0) - created_ns) <= slack]
    return min(near, key=lambda c: abs((c.get("start_ns") or 0) - created_ns)) if near else None



def old_judge(ys: list[float], policy: LeakPolicy) -> dict[str, Any]:
    """Every measure counted, eagerly, as _judge did before it counted the trend tests only where they matter."""
    import numpy as np

    n = len(ys)
    k = max(2, n // 5)
    start, end = float(np.median(ys[:k])), float(np.median(ys[-k:]))
    tau, z = trend.kendall_tau(ys)
    half = n // 2
    floor_growth = float(min(ys[half:]) - min(ys[:half]))
    third = max(3, n // 3)
    recent, earlier = ys[-third:], ys[:-third]
    recent_tau, _ = trend.kendall_tau(recent)
    recent_growth = float(np.median(recent[-max(2, third // 3):]) - max(earlier)) if earlier else 0.0
    base = min(ys[:half]) if half else start
    growth = end - start
    # every sample above the one before (tau near 1): steadiness is the evidence, size only needs the byte floor
    steady_enough = trend._growth_is_large(growth, start, policy) or (tau >= 0.9 and growth >= policy.min_growth_bytes)
    settled = max(recent) - min(recent) < max(policy.min_growth_bytes, policy.min_growth_fraction * end)
    pattern = None
    climb = policy.min_climb_fraction
    # A climb must stand out of the series' own noise: an allocator that keeps freed pages raises the floor
    # of a noisy but flat process by up to one transient allocation (sample-to-sample jumps of that size).
    noise = 3.0 * float(np.median(np.abs(np.diff(ys)))) if n >= 3 else 0.0
    if settled and floor_growth > noise and trend._growth_is_large(floor_growth, base, policy, climb):
        pattern = "climb"  # grew, then held: the end of the window is flat
    elif tau >= policy.min_tau and z >= 2.5 and steady_enough and floor_growth > 0:
        pattern = "steady"
    elif floor_growth > noise and trend._growth_is_large(floor_growth, base, policy, climb):
        pattern = "climb"
    elif (recent_tau >= policy.min_tau and recent_growth > noise
          and trend._growth_is_large(recent_growth, max(earlier or [start]), policy, climb)):
        pattern = "recent"
    return {"start": start, "end": end, "tau": tau, "floor": floor_growth, "recent": recent_growth,
            "pattern": pattern}



def old_span_section(totals) -> dict[str, Any]:
    """``raysleuth.report.sections.span_section`` as it was: nested defaultdicts, the timeline's row grouping."""
    import statistics
    from collections import defaultdict

    from raysleuth.timeline.summary import phases_from_totals, stragglers_of

    table: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    phases: set[str] = set()
    for step, rank, phase, seconds in totals:
        if step is None or rank is None or type(seconds) not in (int, float):
            continue
        phases.add(phase)
        table[step][rank][phase] += float(seconds)
    steps = sorted(table)
    ranks = sorted({rank for step in table.values() for rank in step})
    step_totals = {rank: [round(sum(table[step][rank].values()), 4) if rank in table[step] else None for step in steps]
                   for rank in ranks}
    mean_phase = {
        rank: {phase: round(statistics.fmean([table[s][rank][phase] for s in steps if rank in table[s]] or [0.0]), 4)
               for phase in sorted(phases)}
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


def normal_events(events) -> list[str]:
    """Trace events with each node's process number replaced by the node's name (numbered in reading order)."""
    import json

    names = {event["pid"]: event["args"]["name"] for event in events if event.get("name") == "process_name"}
    return sorted(json.dumps({**event, "pid": names.get(event["pid"])} | (
        {"args": {"sort_index": None}} if event.get("name") == "process_sort_index" else {}), sort_keys=True)
        for event in events)


def old_identities(store) -> list[tuple]:
    """The run summary's writers as ``reading.identities`` read them before ``counting.writers``: (rank, node_ip,
    hostname, actor_class, first time, last time) per writer identity, by a GROUP BY of every row."""
    return store._db.execute("SELECT rank, node_ip, hostname, actor_class, MIN(time), MAX(time) FROM records"
                             " GROUP BY rank, node_ip, hostname, actor_class").fetchall()
