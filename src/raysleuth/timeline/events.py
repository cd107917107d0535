"""Trace events from the store, streamed as JSON text: spans, instant events, heartbeats, memory counters, Ray tasks.

Each event is written as its JSON text directly (no dict, no encoder call per event): the store gives the few
columns and ``data`` fields an event needs (``json_extract`` in SQL), and each value is spelled the way the C
encoder spells it (strings through its own ``encode_basestring_ascii``, floats by ``repr``, non-finite numbers as
``NaN``/``Infinity``), so the file holds the same bytes as ``json.dumps`` of the same events would. Rows an
ordinary writer never stores (attributes, an error, an event's own data) go through ``json`` as before.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
from typing import Any

from raysleuth.recorder import open_store
from raysleuth.recorder.reading import loads, senders
from raysleuth.recorder.schema import PACKED, VALUE_COLUMNS
from raysleuth.timeline.budget import cut_to_budget
from raysleuth.timeline.model import Timeline, _label, _number, _Tracks
from raysleuth.timeline.ray_tasks import _add_ray_tasks

_encode = json.JSONEncoder(separators=(",", ":"), default=repr).encode  # the C encoder (json.dump is pure Python)


def _stream(timeline: Timeline, tracks: _Tracks, address, *, run=None, home=None, steps=None, ranks=None, jobs=None,
            ray_tasks=True, since=None, until=None, limit: int | None = None, chunk: int = 5000):
    """Trace events as JSON texts in chunks, counted on ``timeline`` as they go (the store read a batch at a time).

    Read rank by rank, in time order within a rank: a rank's rows lie together in the file, so this reads
    at half the CPU of a time-ordered scan; the events' order does not matter to a trace viewer. ``limit``:
    past that many records, only the newest that fit (:func:`~raysleuth.timeline.budget.cut_to_budget`).
    """
    store = open_store(run, home=home)
    timeline.run = store.path.parent.name
    step_min, step_max = steps if steps else (None, None)
    if limit is not None:
        since = cut_to_budget(store, timeline, limit, ranks=ranks, jobs=jobs, steps=steps, since=since, until=until)
    bounds = {"rank": ranks, "job": jobs, "since": since, "until": until}
    worker_ranks: dict[tuple[str | None, int | None], int] = {}
    window = [float("inf"), float("-inf")]
    texts: list[str] = []
    # each row read with its sender's number, its identity looked up once a sender (no view join a row)
    identities = senders(store, _IDENTITY)
    fields = ("start", "end", "span_id", "parent_id", "attrs:json", "error:json")
    kinds = ["span", "event", "heartbeat"]
    rows = store.select(kinds, _ROW_COLUMNS, fields, order="rank", step_min=step_min, step_max=step_max, **bounds) \
        if identities is None else _identified(store.select(kinds, _OWN_ROW_COLUMNS, fields, order="rank",
                                                            step_min=step_min, step_max=step_max, **bounds),
                                               identities)
    event = _Writer(timeline, tracks, worker_ranks, window, texts)
    for row in rows:
        event.row(row)
        if len(texts) >= chunk:
            yield texts
            texts = event.texts = []
    bounded = steps is not None and window[0] <= window[1]
    memory_bounds = {**bounds, "since": max(window[0], since or window[0]) if bounded else since,
                     "until": min(window[1], until or window[1]) if bounded else until}
    for time_, rank, pid, node_id, node_ip, data, values in _memory_rows(store, identities, memory_bounds):
        text = event.memory(time_, rank, pid, node_id, node_ip, data, values)
        if text is not None:
            texts.append(text)
            timeline.memory_samples += 1
            if len(texts) >= chunk:
                yield texts
                texts = event.texts = []
    store.close()
    yield texts
    if ray_tasks:
        held, timeline.events = timeline.events, []  # the tasks alone, whatever the caller holds
        cut = [since, until or float("inf")] if timeline.cut_since is not None else None  # the trace's own cut
        _add_ray_tasks(timeline, tracks, address, worker_ranks, ranks, window if bounded else cut, jobs)
        tasks, timeline.events = timeline.events, held
        yield [_encode(task) for task in tasks]


_ROW_COLUMNS = ("kind", "time", "rank", "step", "name", "pid", "node_id", "node_ip", "actor_class", "data")
_IDENTITY = ("pid", "node_id", "node_ip", "actor_class")
_OWN_ROW_COLUMNS = ("kind", "time", "rank", "step", "name", "sender", "stored")
_NO_IDENTITY = (None,) * len(_IDENTITY)
_MEMORY_KEYS = PACKED["memory"][:5]
"""The packed memory sample's ``*_bytes`` fields, in the value columns ``v0``..``v4``."""


def _identified(rows, identities: dict[int, tuple]):
    """Rows of ``_OWN_ROW_COLUMNS`` + fields as rows of ``_ROW_COLUMNS`` + fields (the sender's identity put in)."""
    for row in rows:
        yield row[:5] + identities.get(row[5], _NO_IDENTITY) + row[6:]


def _memory_rows(store, identities: dict[int, tuple] | None, bounds: dict):
    """(time, rank, pid, node id, node ip, data as JSON text or None, packed values or None) of each memory
    sample: a packed sample's numbers read from its value columns, not from the JSON the view makes of them."""
    if identities is None:
        for row in store.select("memory", ("time", "rank", "pid", "node_id", "node_ip", "data"), order="rank",
                                **bounds):
            yield row + (None,)
        return
    for time_, rank, sender, stored, *values in store.select("memory", ("time", "rank", "sender", "stored")
                                                             + VALUE_COLUMNS[:5], order="rank", **bounds):
        pid, node_id, node_ip, _ = identities.get(sender, _NO_IDENTITY)
        yield (time_, rank, pid, node_id, node_ip, stored, None) if stored else \
            (time_, rank, pid, node_id, node_ip, None, values)


def _value(value: Any) -> str:
    """One JSON value as the C encoder (``_encode``) spells it."""
    kind = type(value)
    if kind is int:
        return int.__repr__(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if value is None:
        return "null"
    if kind is float:
        return _float_text(value)
    return _encode(value)


def _float_text(value: float) -> str:
    """A float as the C encoder spells it (``repr``; ``NaN``/``Infinity`` where it is not finite)."""
    return float.__repr__(value) if value - value == 0 else _encode(value)


def _us_text(seconds: float) -> str:
    """:func:`~raysleuth.timeline.model._us` of ``seconds`` as JSON text."""
    return _float_text(round(seconds * 1e6, 1))


class _Writer:
    """The JSON text of each row's trace event(s), appended to ``texts``; the tracks made as writers appear."""

    def __init__(self, timeline: Timeline, tracks: _Tracks, worker_ranks: dict, window: list, texts: list) -> None:
        self.timeline, self.tracks, self.worker_ranks, self.window, self.texts = (
            timeline, tracks, worker_ranks, window, texts)
        self.names: dict[Any, str] = {}
        self.track_texts: dict[tuple[int, int], str] = {}
        self.memory_keys: dict[str, str] = {}
        self.memory_values: dict[Any, str] = {}
        self.memory_tracks: dict[tuple, tuple[str, str]] = {}

    def _track(self, node_id, node_ip, worker_pid, rank, actor_class) -> str:
        who = (node_id, node_ip, worker_pid, rank, actor_class)
        track = self.tracks.seen.get(who)
        if track is None:  # the same writer again: its track is known (a million rows, a thousand writers)
            pid = self.tracks.pid(node_id, node_ip)
            track = self.tracks.seen[who] = (pid, self.tracks.tid(pid, worker_pid, _label(rank, actor_class,
                                                                                          worker_pid)))
            if rank is not None:
                self.worker_ranks[(node_id, worker_pid)] = rank
        text = self.track_texts.get(track)
        if text is None:
            text = self.track_texts[track] = f'"pid":{track[0]},"tid":{track[1]}'
        return text

    def _name(self, name: Any) -> str:
        text = self.names.get(name)
        if text is None:
            text = self.names[name] = _value(name)
        return text

    def row(self, row: tuple) -> None:
        """The trace event(s) of one span, event or heartbeat row."""
        kind, time_, rank, step, name, worker_pid, node_id, node_ip, actor_class, data, start, end, span_id, \
            parent_id, attrs, error = row
        track = self._track(node_id, node_ip, worker_pid, rank, actor_class)
        if kind == "span":
            self._span(track, step, rank, name or "span", worker_pid, time_, start, end, span_id, parent_id, attrs,
                       error)
            return
        name = f"step {step}" if kind == "heartbeat" else (name or "event")
        own = _own_step(data)
        if own is not None:  # a heartbeat's data: its step alone (the common row, read without a parse)
            args = f'{{"step":{own},"rank":{_value(rank)}}}'
        else:
            data = _data(data)
            if not data or (len(data) == 1 and "step" in data):
                args = f'{{"step":{_value(data.get("step", step))},"rank":{_value(rank)}}}'
            else:
                args = _encode({"step": step, "rank": rank, **data})
        self.texts.append(f'{{"name":{self._name(name)},"cat":{self._name(kind)},"ph":"i","s":"t",'
                          f'"ts":{_us_text(time_)},{track},"args":{args}}}')
        self.timeline.instant_events += 1

    def _span(self, track, step, rank, name, worker_pid, time_, start, end, span_id, parent_id, attrs, error) -> None:
        start = start if type(start) is float else _number(start, time_)
        end = end if type(end) is float and end >= start else max(start, _number(end, start))
        window = self.window
        if start < window[0]:
            window[0] = start
        if end > window[1]:
            window[1] = end
        head = f'"step":{_value(step)},"rank":{_value(rank)},"span_id":{_value(span_id)},' \
               f'"parent_id":{_value(parent_id)}'
        error = None if error in ("null", None) else loads(error)
        if attrs in ("{}", "null", None) and not error:
            args = "{" + head + "}"
        else:
            attrs = {} if attrs in ("{}", "null", None) else (loads(attrs, {}) or {})
            if not isinstance(attrs, dict):
                attrs = {"attrs": attrs}
            merged = {"step": step, "rank": rank, "span_id": span_id, "parent_id": parent_id, **attrs}
            if error:
                merged["error"] = error
            args = _encode(merged)
        if name.startswith("ray.call:"):
            base = f'"name":{self._name(name)},"cat":"ray_call",{track},"id":{_value(f"{worker_pid}-{span_id}")}'
            self.texts.append(f'{{{base},"ph":"b","ts":{_us_text(start)},"args":{args}}}')
            self.texts.append(f'{{{base},"ph":"e","ts":{_us_text(end)},"args":{{}}}}')
        else:
            self.texts.append(f'{{"name":{self._name(name)},"cat":"span","ph":"X","ts":{_us_text(start)},'
                              f'"dur":{_us_text(max(0.0, end - start))},{track},"args":{args}}}')
        self.timeline.spans += 1

    def memory(self, time_, rank, worker_pid, node_id, node_ip, text, values=None) -> str | None:
        """One memory sample's counter event (its ``*_bytes`` values in MiB), or None when it has none.

        ``text``: the sample's JSON; or ``values``: a packed sample's value columns (``_MEMORY_KEYS``' values).
        """
        if values is not None:
            items: Any = zip(_MEMORY_KEYS, values)
        else:
            try:
                data = json.loads(text) if text else {}
            except ValueError:
                return None  # {"raw": text}: no values
            if type(data) is not dict:
                return None  # {"value": data}: no values
            items = data.items()
        parts = []
        keys, spelled_values = self.memory_keys, self.memory_values
        for key, value in items:
            spelled = keys.get(key)
            if spelled is None:
                spelled = keys[key] = (encode_basestring_ascii(key.removesuffix("_bytes") + "_mb") + ":"
                                       if key.endswith("_bytes") else "")
            if spelled and type(value) in _NUMBERS:
                number = spelled_values.get(value)  # many values repeat (reserved, peak): spelled once
                if number is None:
                    if len(spelled_values) > 100_000:
                        spelled_values.clear()
                    number = spelled_values[value] = _float_text(round(float(value) / 2**20, 2))
                parts.append(spelled + number)
        if not parts:
            return None
        who = (node_id, node_ip, rank, worker_pid)
        head = self.memory_tracks.get(who)
        if head is None:
            pid = self.tracks.pid(node_id, node_ip)
            name = f"rank {rank}" if rank is not None else f"pid {worker_pid}"
            head = self.memory_tracks[who] = (f'{{"name":{_value("memory " + name)},"cat":"memory","ph":"C","ts":',
                                              f',"pid":{pid},"tid":0,"args":{{')
        return f'{head[0]}{_us_text(time_)}{head[1]}{",".join(parts)}}}}}'


#: The types ``json.loads`` gives a number (``True`` counts: ``isinstance(True, int)``).
_NUMBERS = frozenset((int, float, bool))


def _own_step(text: Any) -> str | None:
    """``N`` when ``text`` is exactly ``{"step":N}`` with ``N`` a plain non-negative integer, else None."""
    if type(text) is str and text.startswith('{"step":') and text.endswith("}"):
        digits = text[8:-1]
        if digits.isascii() and digits.isdigit() and (digits == "0" or digits[0] != "0"):
            return digits
    return None


def _data(text: str | None) -> dict[str, Any]:
    """A row's data as the store's ``query`` reads it (not an object: wrapped)."""
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {"raw": text}
    return data if isinstance(data, dict) else {"value": data}


def _write_events(handle, texts: list[str], written: int) -> int:
    """Append events' JSON texts to the open ``traceEvents`` array of ``handle``; the count written so far."""
    if texts:
        handle.write(("," if written else "") + ",".join(texts))
    return written + len(texts)
