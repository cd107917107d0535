"""Worker side: this process's collectives in a bounded ring, torch's Flight Recorder, dumps.

Two sources, read together at dump time:

- **torch's Flight Recorder** (``TORCH_FR_BUFFER_SIZE``, set by :func:`install`
  before any process group exists, in full mode only: see
  :func:`flight_recorder_wanted`): every collective the process group
  issues, DDP's gradient buckets included, with ``collective_seq_id`` per
  process group, op, sizes and dtypes. Read with torch's JSON dump, never the
  pickle one.
- **a light wrapper** on the ``torch.distributed`` collectives: each call's
  op, start and end times and step, its own sequence per process group (the
  fallback where the Flight Recorder is off), and a counter of completed
  collectives that the progress thread turns into heartbeats. Each call's
  file:line and shapes in full mode (or armed with the control key
  ``collectives.detail``); in light mode only the calls still running have a
  file:line, read from the caller's stack at dump time (:mod:`.hook`).

Dumps go to the evidence store as ``collectives`` records: on request (the
control key ``collectives.dump``, handled on the control thread while the
training thread sits in the collective), at exit, and every second in full
mode (only when something changed), so a process that gloo aborts leaves its
last positions behind.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import sys
import threading
import time
from typing import Any, Callable

from raysleuth import control, runtime
from raysleuth.collectives import hook
from raysleuth.collectives.hook import (
    WrapOnImport,
    _groups,
    _progress,
    _wake,
    set_detail,
    wrap_collectives,
)
from raysleuth.collectives.model import ENTRIES_PER_GROUP, entries_asked

FR_BUFFER_SIZE = "2000"
"""Flight Recorder entries torch keeps per process in full mode (``TORCH_FR_BUFFER_SIZE`` unless set)."""
FULL_MODE_INTERVAL = 1.0
HEARTBEAT_INTERVAL = 2.0

_installed = False
_last_dump_key: Any = None


def _torch() -> tuple[Any, Any] | None:
    """(torch, distributed_c10d) once the job's import of torch.distributed has finished, else None.

    Never imports: a background thread that imports torch while the job's
    main thread is importing it deadlocks on the module locks.
    """
    c10d = hook._c10d
    torch = sys.modules.get("torch")
    if c10d is None or torch is None:
        return None
    return torch, c10d


# ------------------------------------------------------------------ install


def install() -> None:
    """Switch collective recording on in this worker; usable as Ray's ``worker_process_setup_hook``.

    Never raises; a no-op when ``RAYSLEUTH_MODE=off``. Does not import torch:
    the wrapper goes on when the job imports ``torch.distributed``.
    """
    global _installed
    try:
        if _installed:
            return
        if runtime.settings().mode == "off":
            return
        _installed = True
        if flight_recorder_wanted(runtime.settings().mode):
            os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER_SIZE)
        set_detail(runtime.settings().mode == "full")
        if "torch.distributed" in sys.modules:
            wrap_collectives()
        else:
            sys.meta_path.insert(0, WrapOnImport())
        control.register("collectives.dump", _on_request)
        control.register("collectives.detail", _on_detail)
        atexit.register(_dump_quietly, "exit")
        threading.Thread(target=_background, args=(runtime.settings().mode,),
                         name="raysleuth-collectives", daemon=True).start()
    except Exception:
        pass


def flight_recorder_wanted(mode: str) -> bool:
    """Whether :func:`install` switches torch's Flight Recorder on: in full mode only.

    torch 2.13 keeps one by default, so in light mode (the default, < 2 % of a
    1 MiB gloo ``all_reduce``: ``bench/bench_collectives.py``) raysleuth leaves
    it as the job has it. Light mode keeps the light wrapper: every call the job
    makes itself, with its start and end times (``start_ns``/``end_ns``) and
    step, but not DDP's gradient buckets, and file:line only for the calls still
    running when it dumps. A job that wants the Flight Recorder where torch keeps
    none sets ``TORCH_FR_BUFFER_SIZE`` itself (torch's own switch, read when a
    process group is created).
    """
    return mode == "full"


# --------------------------------------------------------------------- dump


#: torch keeps one Flight Recorder per kind of work event: gloo's (and other CPU backends') is read with
#: ``_dump_fr_trace_json``, NCCL's (CUDA events) with ``_dump_nccl_trace_json``, which only builds with NCCL have.
_FR_READERS = ("_dump_fr_trace_json", "_dump_nccl_trace_json")


def _read_fr(c10d_bindings: Any, include_collectives: bool) -> dict | None:
    """Every Flight Recorder this torch has, merged: entries in one list, ``pg_status`` per group."""
    merged: dict | None = None
    for reader in _FR_READERS:
        dump_json = getattr(c10d_bindings, reader, None)
        if dump_json is None:
            continue
        try:
            raw = dump_json(includeCollectives=include_collectives)
            data = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        except Exception:
            continue
        if not isinstance(data, dict):
            continue
        if merged is None:
            merged = {**data, "entries": [], "pg_status": {}}
        merged["entries"] += list(data.get("entries") or [])
        for group, status in (data.get("pg_status") or {}).items():
            if _enqueued(status) >= _enqueued(merged["pg_status"].get(group)):
                merged["pg_status"][group] = status  # the recorder this group really uses is the one that moved
    return merged


def _enqueued(status: Any) -> int:
    try:
        return int(status.get("last_enqueued_collective"))
    except (AttributeError, TypeError, ValueError):
        return -1


def read_flight_recorder() -> dict | None:
    """torch's Flight Recorder for this process, as JSON (None where it is off or missing)."""
    try:
        ready = _torch()
        if ready is None or not ready[1].is_initialized():
            return None
        return _read_fr(ready[0]._C._distributed_c10d, True)
    except Exception:
        return None


_FR_FIELDS = ("collective_seq_id", "p2p_seq_id", "is_p2p", "profiling_name", "input_sizes", "input_dtypes",
              "output_sizes", "output_dtypes", "process_group", "state", "retired", "time_created_ns",
              "time_discovered_started_ns", "time_discovered_completed_ns", "record_id", "timeout_ms")


def _newest_per_group(entries: list[dict], key: Callable[[dict], str], limit: int) -> list[dict]:
    counts: dict[str, int] = collections.Counter()
    kept = []
    for entry in reversed(entries):
        group = key(entry)
        if counts[group] < limit:
            counts[group] += 1
            kept.append(entry)
    kept.reverse()
    return kept


def _group_table() -> dict[str, dict[str, Any]]:
    """Every process group this process belongs to: name -> desc and global ranks."""
    table: dict[str, dict[str, Any]] = {}
    try:
        ready = _torch()
        if ready is None:
            return table
        world = ready[1]._world
        for group, name in list(world.pg_names.items()):
            ranks = sorted(world.pg_group_ranks.get(group, {}))
            table[str(name)] = {"desc": str(getattr(group, "group_desc", "") or ""), "ranks": ranks}
    except Exception:
        pass
    for name, _, desc in list(_groups.values()):
        table.setdefault(name, {"desc": desc, "ranks": []})
    return table


def _rank_and_size() -> tuple[int | None, int | None]:
    try:
        ready = _torch()
        if ready is not None and ready[1].is_initialized():
            return ready[1].get_rank(), ready[1].get_world_size()
    except Exception:
        pass
    try:
        return runtime.get_rank(), runtime.get_world_size()
    except Exception:
        return None, None


def _job_id() -> str | None:
    try:
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            return ray.get_runtime_context().get_job_id()
    except Exception:
        pass
    return None


PERIODIC_CONTEXT = 8
"""A periodic dump always repeats this many newest entries per group (a reader of the newest dump alone sees them)."""
_periodic_floor: dict[tuple[str, str], int] = {}
"""(source, group) -> the newest sequence number a periodic dump sent in its final state, with all before it."""


def _delta(entries: list, source: str, group_of: Callable, seq_of: Callable, final: Callable) -> list:
    """The entries a periodic dump sends: newer than the floor (new, or not final when last sent) + the newest few."""
    by_group: dict[str, list] = collections.defaultdict(list)
    for entry in entries:
        by_group[group_of(entry)].append(entry)
    kept = []
    for group, listed in by_group.items():
        floor = _periodic_floor.get((source, group), -1)
        chosen = [e for k, e in enumerate(listed) if seq_of(e) > floor or k >= len(listed) - PERIODIC_CONTEXT]
        for entry in chosen:  # the floor rises over the final entries sent, in order
            if seq_of(entry) > floor and not final(entry):
                break
            floor = max(floor, seq_of(entry))
        _periodic_floor[(source, group)] = floor
        kept += chosen
    return kept


def _seq(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def snapshot(reason: str = "request", *, limit: int = ENTRIES_PER_GROUP, request: Any = None) -> dict[str, Any]:
    """This process's collective positions as one JSON-ready dict (the ``collectives`` record's data).

    A ``periodic`` dump (full mode, every second) is a delta: only the entries new or changed since the
    previous periodic dump, plus the newest :data:`PERIODIC_CONTEXT` per group (``delta: true``). Every
    wrapper call's start_ns/end_ns per (pg, seq) still reaches the store once in its final state.
    """
    rank, world_size = _rank_and_size()
    calls = _newest_per_group(hook.entries(), lambda e: e["pg"], limit)
    fr = read_flight_recorder()
    fr_part = None
    if fr is not None:
        entries = [{k: e.get(k) for k in _FR_FIELDS} for e in fr.get("entries") or []]
        entries = _newest_per_group(entries, lambda e: str((e.get("process_group") or ["?"])[0]), limit)
        if reason == "periodic":
            entries = _delta(entries, "fr", lambda e: str((e.get("process_group") or ["?"])[0]),
                             lambda e: _seq(e.get("collective_seq_id")), lambda e: e.get("state") == "completed")
        fr_part = {"version": fr.get("version"), "entries": entries, "pg_status": fr.get("pg_status") or {}}
    if reason == "periodic":
        calls = _delta(calls, "calls", lambda c: str(c.get("pg")), lambda c: _seq(c.get("seq")),
                       lambda c: c.get("state") in ("completed", "error"))
    return {
        "reason": reason, "request": request, "time": time.time(), "pid": os.getpid(),
        "rank": rank, "world_size": world_size, "job_id": _job_id(), "progress": _progress[0],
        "groups": _group_table(), "calls": calls, "flight_recorder": fr_part, "delta": reason == "periodic",
        "detail": hook._detail[0],
    }


def dump(reason: str = "request", *, request: Any = None) -> dict[str, Any] | None:
    """Write this process's collective records to the evidence store; returns what was written."""
    try:
        data = snapshot(reason, request=request, limit=entries_asked(request))
        if reason != "joined" and not data["calls"] and not (data["flight_recorder"] or {}).get("entries"):
            return None
        # lazy: installed in every worker at start-up: the recorder loads at the first dump
        from raysleuth.recorder import get_client, record

        record("collectives", data, name=reason, level="INFO")
        get_client().flush(timeout=5.0)  # a process that gloo aborts or the OOM killer takes keeps nothing unsent
        return data
    except Exception:
        return None


def _dump_quietly(reason: str) -> None:
    try:
        if _installed and _changed():
            dump(reason)
    except Exception:
        pass


def _on_request(value: Any) -> None:
    if value is not None:
        dump("request", request=value)


def _on_detail(value: Any) -> None:
    """``collectives.detail``: a true value arms detail recording (file:line, shapes) from the next call on."""
    if value is not None:
        set_detail(bool(value) or runtime.settings().mode == "full")


def _changed() -> bool:
    """Did anything happen since the last periodic dump? (ring or Flight Recorder positions)"""
    global _last_dump_key
    newest = hook._ring[-1] if hook._ring else None  # a new call is a new newest entry: another list, started later
    key = (_progress[0], *((id(newest), newest[hook._START], newest[hook._END]) if newest is not None else ()),
           _fr_position())
    if key == _last_dump_key:
        return False
    _last_dump_key = key
    return True


def _fr_position() -> Any:
    try:
        ready = _torch()
        if ready is None or not ready[1].is_initialized():
            return None
        status = (_read_fr(ready[0]._C._distributed_c10d, False) or {}).get("pg_status") or {}
        return tuple(sorted((k, v.get("last_enqueued_collective"), v.get("last_completed_collective"))
                            for k, v in status.items()))
    except Exception:
        return None


def progress_count(fr_position: Any = None) -> int:
    """Collectives completed so far: the wrapper's count, or the Flight Recorder's where larger (DDP)."""
    count = _progress[0]
    if fr_position:
        total = 0
        for _, _, completed in fr_position:
            try:
                total += max(0, int(completed))
            except (TypeError, ValueError):
                pass
        count = max(count, total)
    return count


def _background(mode: str) -> None:
    """Heartbeats from collective progress; in full mode, dumps whenever positions change."""
    last_beat, last_count, joined = 0.0, -1, False
    while True:
        if _wake.wait(FULL_MODE_INTERVAL if mode == "full" else HEARTBEAT_INTERVAL):
            _wake.clear()
            joined = False  # a new process group: say again which groups this rank is in
        try:
            ready = _torch()
            if ready is None:
                continue  # torch.distributed not (fully) imported yet: touch nothing of torch
            if not joined and ready[1].is_initialized() and _rank_and_size()[0] is not None:
                joined = dump("joined") is not None  # rank, pid and groups: a rank killed early is still known
            position = _fr_position()
            count = progress_count(position)
            now = time.time()
            if count != last_count and count > 0 and now - last_beat >= HEARTBEAT_INTERVAL:
                _heartbeat(count)
                last_beat, last_count = now, count
            if mode == "full" and _changed():
                dump("periodic")
        except Exception:
            pass


def _heartbeat(count: int) -> None:
    """A heartbeat whose step is the count of completed collectives, unless the job names its steps."""
    # lazy: installed in every worker at start-up: the recorder loads at the first heartbeat
    from raysleuth.recorder import record

    if runtime.current_step() is not None:
        return  # the job's own steps (rs.step / rs.heartbeat) are the progress measure
    record("heartbeat", {"step": count, "collectives": count, "source": "collectives"})
