"""One timeline of the whole job: Ray tasks, raysleuth spans, events and memory, per node and rank.

:func:`build_timeline` merges, as Chrome/Perfetto trace events
(https://ui.perfetto.dev, chrome://tracing):

- **spans** (kind ``span``) as complete events (``ph: X``), ``args.step``
  set; detailed-tracing spans (``ray.call:*``) as async slices (``b``/``e``),
  since calls in flight overlap;
- **instant events** (kind ``event``) as ``ph: i`` and heartbeats as ``step N``;
- **memory samples** (kind ``memory``) as counter tracks (``ph: C``);
- **Ray tasks** from the State API while the cluster lives: each attempt's
  running interval as a complete event on its worker, with its wait before it.

One process (``pid``) per node, one thread (``tid``) per worker process
(its OS pid), named ``rank N · Class (pid)``. All nodes' clocks are taken as
they are (wall time); on one machine they agree, across machines NTP keeps
them within milliseconds. ``--steps`` and ``--ranks`` bound the size.

:func:`summarize_steps` is the straggler view: per step and phase, each
rank's time in it, the slowest rank and its lag behind the median.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from raysleuth.errors import UsageError
from raysleuth.options import parse_ranks, parse_steps  # re-exported: the parsers' one home is raysleuth.options

__all__ = [
    "StepPhase",
    "Timeline",
    "build_timeline",
    "export_timeline",
    "parse_ranks",
    "parse_steps",
    "summarize_steps",
    "timeline_summary",
]


@dataclasses.dataclass(kw_only=True)
class Timeline:
    """Trace events and what went into them."""

    events: list[dict[str, Any]]
    spans: int = 0
    instant_events: int = 0
    memory_samples: int = 0
    ray_tasks: int = 0
    run: str | None = None
    path: str | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)

    def to_chrome(self) -> dict[str, Any]:
        """The Chrome trace JSON object (``traceEvents`` + metadata)."""
        return {"traceEvents": self.events, "displayTimeUnit": "ms",
                "otherData": {"generator": "raysleuth", "run": self.run, "warnings": self.warnings}}

    def to_dict(self) -> dict[str, Any]:
        """A summary of the export (not the events)."""
        return {key: value for key, value in dataclasses.asdict(self).items() if key != "events"} | {
            "trace_events": len(self.events)}


@dataclasses.dataclass(kw_only=True)
class StepPhase:
    """One step's phase across ranks: the straggler view."""

    step: int
    phase: str
    durations: dict[str, float]
    """Seconds per rank (``"3"``) or, without a rank, per worker (``"pid 1234"``)."""
    median_s: float
    slowest: str
    slowest_s: float
    lag_s: float
    """How far the slowest is behind the median."""
    lag_ratio: float


# ----------------------------------------------------------------- building


class _Tracks:
    """pid per node, tid per worker, and their names (metadata events)."""

    def __init__(self) -> None:
        self.node_pids: dict[str, int] = {}
        self.thread_names: dict[tuple[int, int], str] = {}
        self.node_names: dict[int, str] = {}

    def pid(self, node_id: str | None, node_ip: str | None = None, is_head: bool = False) -> int:
        key = node_id or "local"
        if key not in self.node_pids:
            self.node_pids[key] = len(self.node_pids) + 1
            label = f"node {node_ip or '?'}" + (" (head)" if is_head else "") + (f" {key[:8]}" if node_id else "")
            self.node_names[self.node_pids[key]] = label
        elif node_ip and "?" in self.node_names[self.node_pids[key]]:
            self.node_names[self.node_pids[key]] = self.node_names[self.node_pids[key]].replace("?", node_ip)
        return self.node_pids[key]

    def tid(self, pid: int, worker_pid: int | None, label: str | None) -> int:
        tid = int(worker_pid or 0)
        current = self.thread_names.get((pid, tid))
        if label and (current is None or current.startswith("pid ")):
            self.thread_names[(pid, tid)] = label
        elif current is None:
            self.thread_names[(pid, tid)] = f"pid {tid}"
        return tid

    def metadata(self) -> list[dict[str, Any]]:
        events = []
        for pid, name in sorted(self.node_names.items()):
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                           "args": {"sort_index": pid}})
        for (pid, tid), name in sorted(self.thread_names.items()):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}})
            rank = name.split(" ", 2)[1] if name.startswith("rank ") else None
            if rank and rank.isdigit():
                events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": 0,
                               "args": {"sort_index": int(rank)}})
        return events


def _label(rank: int | None, actor_class: str | None, pid: int | None, role: str | None = None) -> str:
    parts = []
    if rank is not None:
        parts.append(f"rank {rank} ·")
    parts.append(actor_class or role or "worker")
    return " ".join(parts) + f" ({pid})"


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def build_timeline(
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
    from raysleuth.recorder import open_store

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
    if ray_tasks:
        _add_ray_tasks(timeline, tracks, address, worker_ranks, ranks, window if bounded else None, jobs)
    timeline.events = tracks.metadata() + sorted(timeline.events, key=lambda event: event["ts"])
    return timeline


def _add_ray_tasks(timeline: Timeline, tracks: _Tracks, address: str | None, worker_ranks, ranks, window, jobs):
    from raysleuth import cluster

    try:
        cluster.connect(address)
        nodes = cluster.nodes()
        node_ips = {node.node_id: node.node_ip for node in nodes}
        heads = {node.node_id for node in nodes if node.is_head_node}
        actors = {actor.actor_id: actor for actor in cluster.actors()}
    except Exception as error:
        timeline.warnings.append(f"Ray task events left out: no cluster answered ({str(error)[:160]})")
        return
    for node_id, node_ip in node_ips.items():
        tracks.pid(node_id, node_ip, node_id in heads)
    try:  # ranks of live workers from outside (Ray Train's logs, start-up environment)
        from raysleuth.labels.live import worker_labels

        live = {(label.get("node_ip"), pid): label.get("rank") for (_ip, pid), label in worker_labels().items()}
    except Exception:
        live = {}
    try:
        listing, truncated = _task_listing(ranks, worker_ranks, live, node_ips, actors, jobs)
    except Exception as error:
        timeline.warnings.append(f"Ray task events left out: the State API did not answer ({str(error)[:160]})")
        return
    if truncated:
        timeline.warnings.append(f"the State API returned only the first {len(listing)} tasks; older ones are missing")
    for task in listing:
        events = sorted((entry for entry in task.events if entry.created_ms), key=lambda entry: entry.created_ms)
        running = next((entry.created_ms for entry in events if (entry.state or "").startswith("RUNNING")), None)
        start_ms = task.start_time_ms or running
        end_ms = task.end_time_ms or next((entry.created_ms for entry in events
                                           if entry.state in ("FINISHED", "FAILED")), None)
        if not start_ms or not task.worker_pid:
            continue  # never ran (pending tasks are `raysleuth tasks --pending`)
        start, end = float(start_ms) / 1000.0, (float(end_ms) / 1000.0 if end_ms else None)
        if end is None:
            import time as _time

            end = _time.time()
        if window and (end < window[0] or start > window[1]):
            continue
        node_id = task.node_id
        rank = worker_ranks.get((node_id, task.worker_pid))
        actor = actors.get(task.actor_id)
        if rank is None:
            rank = live.get((node_ips.get(node_id), task.worker_pid))
        if rank is None:
            rank = cluster.rank_from_name(actor.name if actor else None)
        if ranks is not None and rank not in ranks:
            continue
        pid = tracks.pid(node_id, node_ips.get(node_id))
        tid = tracks.tid(pid, task.worker_pid, _label(rank, actor.class_name if actor else None, task.worker_pid))
        created = float(task.creation_time_ms or start_ms) / 1000.0
        timeline.events.append({
            "name": task.function or task.name or "task", "cat": "ray_task", "ph": "X",
            "ts": _us(start), "dur": _us(max(0.0, end - start)), "pid": pid, "tid": tid,
            "args": {"task_id": task.task_id, "state": task.state, "type": task.type,
                     "attempt": task.attempt_number, "waited_s": round(max(0.0, start - created), 6),
                     "rank": rank, "error_type": task.error_type},
        })
        timeline.ray_tasks += 1


def _task_listing(ranks, worker_ranks, live, node_ips, actors, jobs=None) -> tuple[list, bool]:
    """Ray's tasks for the timeline, and whether a listing was cut at the State API's limit.

    With ``ranks``: only the tasks of those ranks' actors (known from the
    evidence, live labels or actor names), one query per actor, filtered by
    the GCS itself. A long-lived cluster holds many thousands of finished
    tasks (each listed with its events); listing them all takes seconds and
    may be cut before the ones asked for. Only ranked task workers (not
    actors, not drivers) need the whole listing, once. With ``jobs``: one
    listing per job, filtered by the GCS, and only those jobs' tasks.
    """
    from concurrent.futures import ThreadPoolExecutor

    from raysleuth import cluster

    def everything() -> list:
        if not jobs:
            return [cluster.tasks()]
        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(lambda job: cluster.tasks(job_id=job), sorted(set(jobs))))

    if ranks is None:
        listings = everything()
        return [task for listing in listings for task in listing], any(listing.truncated for listing in listings)
    if jobs:
        actors = {key: actor for key, actor in actors.items() if actor.job_id in jobs}
    node_of_ip = {node_ip: node_id for node_id, node_ip in node_ips.items()}
    wanted = {key for key, rank in worker_ranks.items() if rank in ranks and key[1]}
    wanted |= {(node_of_ip.get(ip), pid) for (ip, pid), rank in live.items() if rank in ranks and pid}
    actor_of = {(actor.node_id, actor.pid): actor.actor_id for actor in actors.values() if actor.pid}
    actor_of.update({(None, actor.pid): actor.actor_id for actor in actors.values() if actor.pid})
    ids = {actor.actor_id for actor in actors.values()
           if actor.pid and cluster.rank_from_name(actor.name) in ranks}
    ids |= {actor_of[key] for key in wanted if key in actor_of}
    others = {key for key in wanted if key not in actor_of}
    if others:  # plain task workers run tasks; drivers and processes Ray no longer knows do not
        task_workers = {(worker.node_id, worker.pid) for worker in cluster.workers(alive_only=False)
                        if worker.worker_type == "WORKER"}
        task_workers |= {(None, pid) for _node, pid in task_workers}
        others &= task_workers
    with ThreadPoolExecutor(max_workers=8) as pool:
        listings = list(pool.map(lambda actor_id: cluster.tasks(actor_id=actor_id), sorted(ids)))
    found = [task for listing in listings for task in listing]
    if others:
        whole = everything()
        listings += whole
        found += [task for listing in whole for task in listing if not task.actor_id and
                  ((task.node_id, task.worker_pid) in others or (None, task.worker_pid) in others)]
    return found, any(listing.truncated for listing in listings)


def export_timeline(path: Path | str, address: str | None = None, **options: Any) -> Timeline:
    """Build the timeline (see :func:`build_timeline`) and write it as Chrome trace JSON to ``path``."""
    timeline = build_timeline(address, **options)
    target = Path(path).expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(timeline.to_chrome(), handle, separators=(",", ":"), default=repr)
        tmp.replace(target)
    except OSError as error:
        raise UsageError(f"cannot write the timeline to {target} ({error.strerror or error})",
                         fix="pick a writable path with -o") from None
    timeline.path = str(target)
    return timeline


# ------------------------------------------------------------------ summary


def _number(value: Any, default: float) -> float:
    """A stored number, or ``default`` when a row holds something else (text, a list, nan)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return float(default)
    return number if math.isfinite(number) else float(default)


def summarize_steps(spans: list[dict[str, Any]]) -> list[StepPhase]:
    """Straggler view from plain spans ``{"step", "name", "rank", "pid", "duration_s"}`` (pure).

    Durations of a phase are summed per rank within a step; a step's phase
    seen on one rank only still gets a row (lag 0).
    """
    grouped: dict[tuple[int, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for span in spans:
        if span.get("step") is None or str(span.get("name", "")).startswith("ray.call:"):
            continue
        who = str(span["rank"]) if span.get("rank") is not None else f"pid {span.get('pid')}"
        grouped[(int(span["step"]), str(span.get("name")))][who] += _number(span.get("duration_s"), 0.0)
    result = []
    for (step, phase), durations in sorted(grouped.items()):
        median = statistics.median(durations.values())
        slowest = max(durations, key=lambda who: durations[who])
        lag = durations[slowest] - median
        result.append(StepPhase(step=step, phase=phase, durations=dict(sorted(durations.items())), median_s=median,
                                slowest=slowest, slowest_s=durations[slowest], lag_s=lag,
                                lag_ratio=(durations[slowest] / median) if median > 0 else 1.0))
    return result


def timeline_summary(*, run: str | None = None, home: Path | str | None = None,
                     steps: tuple[int | None, int | None] | None = None,
                     ranks: list[int] | None = None, jobs: list[str] | None = None) -> list[StepPhase]:
    """Per step and phase: each rank's duration, the slowest rank and its lag behind the median."""
    from raysleuth.recorder import open_store

    store = open_store(run, home=home)
    step_min, step_max = steps if steps else (None, None)
    spans = [{"step": record.step, "name": record.name, "rank": record.rank, "pid": record.pid,
              "duration_s": (record.data or {}).get("duration_s")}
             for record in store.query("span", rank=ranks, job=jobs, step_min=step_min, step_max=step_max)]
    return summarize_steps(spans)
