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
them within milliseconds. ``--steps`` and ``--ranks`` bound the size; past
:data:`~raysleuth.timeline.budget.TRACE_LIMIT` records a trace keeps the
newest that fit and says what it left out (``limit=None``: everything).

:func:`summarize_steps` is the straggler view: per step and phase, each
rank's time in it, the slowest rank and its lag behind the median.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raysleuth.errors import UsageError
from raysleuth.options import parse_ranks, parse_steps  # re-exported: the parsers' one home is raysleuth.options
from raysleuth.timeline.budget import TRACE_LIMIT
from raysleuth.timeline.events import _encode, _stream, _write_events
from raysleuth.timeline.model import StepPhase, Timeline, _Tracks
from raysleuth.timeline.summary import summarize_steps, timeline_summary

__all__ = [
    "StepPhase",
    "TRACE_LIMIT",
    "Timeline",
    "build_timeline",
    "export_timeline",
    "parse_ranks",
    "parse_steps",
    "summarize_steps",
    "timeline_summary",
]


def build_timeline(
    address: str | None = None,
    *,
    run: str | None = None,
    home: Path | str | None = None,
    steps: tuple[int | None, int | None] | None = None,
    ranks: list[int] | None = None,
    jobs: list[str] | None = None,
    ray_tasks: bool = True,
    since: float | None = None,
    until: float | None = None,
    limit: int | None = TRACE_LIMIT,
) -> Timeline:
    """Merge the run's spans, events and memory with Ray's task events into trace events.

    ``run``/``home`` pick the evidence store (default: the latest run).
    ``ray_tasks``: also read the State API (skipped, with a warning, when no
    cluster answers). ``steps`` (inclusive range), ``ranks``, ``jobs`` (Ray
    job ids: a cluster shared by several jobs) and ``since``/``until`` (Unix
    times) bound it; ``limit``: past that many records only the newest that fit
    (:mod:`raysleuth.timeline.budget`; None: every record). Events in time order, metadata first.
    """
    timeline = Timeline(events=[])
    tracks = _Tracks()
    for chunk in _stream(timeline, tracks, address, run=run, home=home, steps=steps, ranks=ranks, jobs=jobs,
                         ray_tasks=ray_tasks, since=since, until=until, limit=limit):
        if chunk:
            timeline.events.extend(json.loads("[" + ",".join(chunk) + "]"))
    timeline.events = tracks.metadata() + sorted(timeline.events, key=lambda event: event["ts"])
    return timeline


def export_timeline(path: Path | str, address: str | None = None, **options: Any) -> Timeline:
    """Write the timeline (see :func:`build_timeline`) as Chrome trace JSON to ``path``, streamed.

    Events are written as they are read, in chunks, as JSON text (:mod:`.events`); only the tracks (one per
    node and worker) are held, so memory stays flat whatever the run's size. Events come in time order
    per kind (spans and events, then memory, then Ray tasks) with the track names last; Perfetto and
    chrome://tracing sort them on load. ``options``: those of :func:`build_timeline`.
    """
    target = Path(path).expanduser()
    if target.is_dir() or not target.name:
        raise UsageError(f"-o {path}: that is a folder, not a file to write the trace to",
                         fix=f"name the file, e.g. -o {target / 'trace.json'}")
    options.setdefault("limit", TRACE_LIMIT)
    timeline = Timeline(events=[])
    tracks = _Tracks()
    written = 0
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write('{"traceEvents":[')
            for chunk in _stream(timeline, tracks, address, **options):
                written = _write_events(handle, chunk, written)
            written = _write_events(handle, [_encode(event) for event in tracks.metadata()], written)
            other = {"generator": "raysleuth", "run": timeline.run, "warnings": timeline.warnings}
            handle.write('],"displayTimeUnit":"ms","otherData":' + _encode(other) + "}")
        tmp.replace(target)
    except OSError as error:
        raise UsageError(f"cannot write the timeline to {target} ({error.strerror or error})",
                         fix="pick a writable path with -o") from None
    timeline.path = str(target)
    timeline.written = written
    return timeline
