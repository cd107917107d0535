"""Trace events from the store, streamed: spans, instant events, heartbeats, memory counters, then Ray's tasks."""

from __future__ import annotations

import json
from typing import Any

from raysleuth.recorder import open_store
from raysleuth.recorder.reading import loads
from raysleuth.timeline.model import Timeline, _label, _number, _Tracks, _us
from raysleuth.timeline.ray_tasks import _add_ray_tasks


def _stream(timeline: Timeline, tracks: _Tracks, address, *, run=None, home=None, steps=None, ranks=None, jobs=None,
            ray_tasks=True, since=None, until=None, chunk: int = 5000):
    """Trace events in chunks, counted on ``timeline`` as they go (the store read a batch at a time).

    Read rank by rank, in time order within a rank: a rank's rows lie together in the file, so this reads
    at half the CPU of a time-ordered scan; the events' order does not matter to a trace viewer.
    """
    store = open_store(run, home=home)
    timeline.run = store.path.parent.name
    step_min, step_max = steps if steps else (None, None)
    bounds = {"rank": ranks, "job": jobs, "since": since, "until": until}
    worker_ranks: dict[tuple[str | None, int | None], int] = {}
    window = [float("inf"), float("-inf")]
    events: list[dict[str, Any]] = []
    rows = store.select(["span", "event", "heartbeat"], _ROW_COLUMNS, ("start", "end", "span_id", "parent_id",
                        "attrs:json", "error:json"), order="rank", step_min=step_min, step_max=step_max, **bounds)
    for row in rows:
        _event_of(row, timeline, tracks, worker_ranks, window, events)
        if len(events) >= chunk:
            yield events
            events = []
    bounded = steps is not None and window[0] <= window[1]
    memory_bounds = {**bounds, "since": max(window[0], since or window[0]) if bounded else since,
                     "until": min(window[1], until or window[1]) if bounded else until}
    for time_, rank, pid, node_id, node_ip, data in store.select(
            "memory", ("time", "rank", "pid", "node_id", "node_ip", "data"), order="rank", **memory_bounds):
        event = _memory_event(tracks, time_, rank, pid, node_id, node_ip, data)
        if event is not None:
            events.append(event)
            timeline.memory_samples += 1
        if len(events) >= chunk:
            yield events
            events = []
    store.close()
    yield events
    if ray_tasks:
        held, timeline.events = timeline.events, []  # the tasks alone, whatever the caller holds
        _add_ray_tasks(timeline, tracks, address, worker_ranks, ranks, window if bounded else None, jobs)
        tasks, timeline.events = timeline.events, held
        yield tasks


_ROW_COLUMNS = ("kind", "time", "rank", "step", "name", "pid", "node_id", "node_ip", "actor_class", "data")


def _event_of(row: tuple, timeline: Timeline, tracks: _Tracks, worker_ranks: dict, window: list, events: list) -> None:
    """The trace event(s) of one span, event or heartbeat row."""
    kind, time_, rank, step, name, worker_pid, node_id, node_ip, actor_class, data, start, end, span_id, parent_id, \
        attrs, error = row
    who = (node_id, node_ip, worker_pid, rank, actor_class)
    track = tracks.seen.get(who)
    if track is None:  # the same writer again: its track is known (a million rows, a thousand writers)
        pid = tracks.pid(node_id, node_ip)
        track = tracks.seen[who] = (pid, tracks.tid(pid, worker_pid, _label(rank, actor_class, worker_pid)))
        if rank is not None:
            worker_ranks[(node_id, worker_pid)] = rank
    pid, tid = track
    if kind == "span":
        start = start if type(start) is float else _number(start, time_)
        end = end if type(end) is float and end >= start else max(start, _number(end, start))
        attrs = {} if attrs in ("{}", "null", None) else (loads(attrs, {}) or {})
        if not isinstance(attrs, dict):
            attrs = {"attrs": attrs}
        if start < window[0]:
            window[0] = start
        if end > window[1]:
            window[1] = end
        args = {"step": step, "rank": rank, "span_id": span_id, "parent_id": parent_id, **attrs}
        error = None if error in ("null", None) else loads(error)
        if error:
            args["error"] = error
        name = name or "span"
        if name.startswith("ray.call:"):
            base = {"name": name, "cat": "ray_call", "pid": pid, "tid": tid, "id": f"{worker_pid}-{span_id}"}
            events.append({**base, "ph": "b", "ts": _us(start), "args": args})
            events.append({**base, "ph": "e", "ts": _us(end), "args": {}})
        else:
            events.append({"name": name, "cat": "span", "ph": "X", "ts": _us(start),
                           "dur": _us(max(0.0, end - start)), "pid": pid, "tid": tid, "args": args})
        timeline.spans += 1
        return
    data = _data(data)
    name = f"step {step}" if kind == "heartbeat" else (name or "event")
    events.append({"name": name, "cat": kind, "ph": "i", "s": "t", "ts": _us(time_), "pid": pid, "tid": tid,
                   "args": {"step": step, "rank": rank, **data}})
    timeline.instant_events += 1


def _data(text: str | None) -> dict[str, Any]:
    """A row's data as the store's ``query`` reads it (not an object: wrapped)."""
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {"raw": text}
    return data if isinstance(data, dict) else {"value": data}


def _memory_event(tracks: _Tracks, time_, rank, worker_pid, node_id, node_ip, text) -> dict[str, Any] | None:
    data = _data(text)
    values = {key.removesuffix("_bytes") + "_mb": round(float(value) / 2**20, 2) for key, value in data.items()
              if key.endswith("_bytes") and isinstance(value, (int, float))}
    if not values:
        return None
    pid = tracks.pid(node_id, node_ip)
    who = f"rank {rank}" if rank is not None else f"pid {worker_pid}"
    return {"name": f"memory {who}", "cat": "memory", "ph": "C", "ts": _us(time_), "pid": pid, "tid": 0,
            "args": values}


_encode = json.JSONEncoder(separators=(",", ":"), default=repr).encode  # the C encoder (json.dump is pure Python)


def _write_events(handle, events: list[dict[str, Any]], written: int) -> int:
    if events:
        handle.write(("," if written else "") + _encode(events)[1:-1])
    return written + len(events)
