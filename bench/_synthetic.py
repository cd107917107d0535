"""A synthetic run written through the real store API: N ranks for M minutes, as instruments write them.

Used by ``bench/bench_scale.py`` (1,000 ranks x 60 minutes) and by
``tests/test_scale.py`` (100 ranks x 5 minutes, answers compared with the
unoptimised readers). Rows are packed exactly as the recorder client packs
them (``ROW_COLUMNS`` with one identity header per rank) and inserted with
:meth:`EvidenceStore.write_batch`, the writer actor's own path, every rank's rows of each ``WINDOW`` seconds in
turn, as a live writer receives them.

What each rank writes (``light``, the default mode; ``full`` in brackets):

- ``memory`` every 10 s [1 s] (``source: watch``, CUDA fields set); rank
  ``leaker`` grows 40 MiB a minute, the others are flat with noise;
- one ``train_step`` span and one heartbeat per step, a step every 12 s
  [3 s]; rank ``straggler`` takes 1.6x as long;
- a WARNING log every 10 minutes [an INFO log every step as well]; one
  ERROR log on rank ``culprit``;
- a ``rank`` event, a ``joined`` collectives dump at the start and a
  ``request`` dump at the end (as many wrapper calls and Flight Recorder
  entries as a worker's dump holds, ``ENTRIES_PER_GROUP``): rank
  ``culprit`` completed #N and never entered #N+1, where every other rank
  waits;
- one ``consistency`` check record per 10 minutes (rank 0 writes it).
"""

from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path
from typing import Any

START = 1_780_000_000.0
JOB = "01000000"
#: Seconds of every rank's rows written in turn (a live writer takes each worker's delivery every 0.2 s; coarser
#: here, for speed: a pass of the writer still holds every rank's few dozen samples).
WINDOW = 10.0
RANKS_PER_NODE = 8
MiB = 2**20


def _hex(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def identity(rank: int, world: int) -> dict[str, Any]:
    """The batch header a rank's client sends (who wrote the rows)."""
    node = rank // RANKS_PER_NODE
    return {"world_size": world, "node_id": _hex(f"node{node}", 56), "node_ip": f"10.0.{node // 250}.{node % 250 + 1}",
            "hostname": f"gpu-node-{node:04d}", "pid": 20_000 + rank, "actor_id": _hex(f"actor{rank}", 32),
            "actor_name": f"TrainWorker_rank{rank}", "actor_class": "TrainWorker",
            "client_id": _hex(f"client{rank}", 16), "job_id": JOB}


def _calls_and_fr(rank: int, top: int, stuck: bool, end: float) -> tuple[list, dict]:
    """The newest wrapper calls and Flight Recorder entries of one rank at the end of the run, as many as a
    worker's dump holds (``ENTRIES_PER_GROUP``)."""
    from raysleuth.collectives.model import ENTRIES_PER_GROUP

    last = top - 1 if stuck else top
    calls, entries = [], []
    for seq in range(max(1, last - ENTRIES_PER_GROUP + 1), last + 1):
        start_ns = int((end - 30.0 - (top - seq) * 0.05) * 1e9)  # the newest one has waited 30 s
        pending = seq == last and not stuck
        end_ns = None if pending else start_ns + 4_000_000
        calls.append({"pg": "0", "seq": seq, "op": "all_reduce", "input": [[[4096, 4096], "float32"]],
                      "output": [[[4096, 4096], "float32"]], "state": "started" if pending else "completed",
                      "start_ns": start_ns, "end_ns": end_ns, "file": "/job/train.py", "line": 61,
                      "function": "train_step", "step": None, "call": seq})
        entries.append({"collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False,
                        "profiling_name": "nccl:all_reduce", "input_sizes": [[4096, 4096]],
                        "input_dtypes": ["Float"], "output_sizes": [[4096, 4096]], "output_dtypes": ["Float"],
                        "process_group": ["0", "default_pg"], "state": "scheduled" if pending else "completed",
                        "retired": not pending, "time_created_ns": start_ns + 1000,
                        "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
                        "record_id": seq, "timeout_ms": 600000})
    status = {"0": {"last_enqueued_collective": last, "last_started_collective": last,
                    "last_completed_collective": last if stuck else last - 1}}
    return calls, {"version": "2.10", "entries": entries, "pg_status": status}


def rank_rows(rank: int, *, world: int, minutes: float, mode: str, culprit: int, leaker: int,
              straggler: int, seed: int = 0) -> list[tuple]:
    """Every row one rank writes over the run, packed as ``ROW_COLUMNS`` (seq filled by the caller)."""
    rng = random.Random(seed * 100_003 + rank)
    seconds = minutes * 60.0
    end = START + seconds
    memory_every, step_every = (1.0, 3.0) if mode == "full" else (10.0, 12.0)
    rows: list[tuple] = [("event", START + 0.5, rank, None, None, "rank", "INFO",
                          {"rank": rank, "world_size": world, "rank_source": "env"})]
    groups = {"0": {"desc": "default_pg", "ranks": list(range(world))}}
    joined = {"reason": "joined", "request": None, "time": START + 1.0, "pid": 20_000 + rank, "rank": rank,
              "world_size": world, "job_id": JOB, "progress": 0, "groups": groups, "calls": [],
              "flight_recorder": None}
    rows.append(("collectives", START + 1.0, rank, None, None, "joined", "INFO", joined))
    base = 6_000 * MiB + rank * MiB
    t = START + 2.0
    while t < end:
        growth = (t - START) / 60.0 * 40 * MiB if rank == leaker else 0.0
        uss = int(base + growth + rng.randint(-8, 8) * MiB)
        data = {"rss_bytes": uss + 900 * MiB, "uss_bytes": uss, "cuda_allocated_bytes": 30_000 * MiB + rng.randint(0, 64) * MiB,
                "cuda_reserved_bytes": 34_000 * MiB, "cuda_peak_bytes": 33_000 * MiB, "source": "watch"}
        rows.append(("memory", t, rank, int((t - START) // step_every), None, None, None, data))
        t += memory_every
    step, t = 0, START + 3.0
    while t + step_every < end:
        duration = step_every * (0.9 if rank == straggler else 0.55) + rng.random() * 0.05
        span = {"start": t, "end": t + duration, "duration_s": duration, "span_id": step + 1, "parent_id": None,
                "attrs": {}, "thread": 140_000_000 + rank}
        rows.append(("heartbeat", t, rank, step, None, None, None, {"step": step}))
        rows.append(("span", t, rank, step, "train_step", "train_step", None, span))
        if mode == "full" and step % 2 == 0:
            rows.append(("log", t + duration, rank, step, None, "train", "INFO",
                         {"message": f"step {step} loss {1.0 / (step + 1):.4f}", "template": "step %s loss %.4f",
                          "module": "train", "lineno": 88, "funcName": "train_step", "thread": "MainThread"}))
        step += 1
        t += step_every
    for minute in range(0, int(minutes), 10):
        at = START + minute * 60 + 30 + rank * 0.001
        rows.append(("log", at, rank, None, None, "train", "WARNING",
                     {"message": f"rank {rank}: data loader slow ({minute} min)", "template": "rank %s: data loader slow",
                      "module": "train", "lineno": 42, "funcName": "load", "thread": "MainThread"}))
        if rank == 0:
            rows.append(("consistency", at, 0, minute, None, "params", "INFO",
                         {"key": "params", "consistent": True, "world_size": world, "step": minute, "rank": 0,
                          "tensors_checked": 12, "mismatches": [], "arrived_ranks": list(range(world)),
                          "missing_ranks": [], "transport": "store", "seconds": 0.2}))
    if rank == culprit:
        rows.append(("log", end - 20, rank, None, None, "train", "ERROR",
                     {"message": "NCCL watchdog: collective timed out", "template": "NCCL watchdog: %s",
                      "module": "train", "lineno": 99, "funcName": "train_step", "thread": "MainThread"}))
    top = max(2, int(seconds / 0.05) // 10)
    calls, fr = _calls_and_fr(rank, top, rank == culprit, end - 1.0)
    request = {"reason": "request", "request": {"id": "bench", "time": end - 1.0}, "time": end - 0.5,
               "pid": 20_000 + rank, "rank": rank, "world_size": world, "job_id": JOB, "progress": top,
               "groups": groups, "calls": calls, "flight_recorder": fr}
    rows.append(("collectives", end - 0.5, rank, None, None, "request", "INFO", request))
    return rows


def build_store(path: Path | str, *, ranks: int = 1000, minutes: float = 60.0, mode: str = "light", culprit: int = 7,
                leaker: int = 13, straggler: int = 5, seed: int = 0, window: float = WINDOW) -> dict[str, int]:
    """Write the synthetic run to ``path`` (an evidence.sqlite, created) and return row counts by kind.

    As a live writer receives them: every rank's rows of each ``window`` seconds in turn, so a pass of the writer
    holds a few dozen samples of every rank, as in a real run, not one rank's whole run (which would make every
    block one worker's hour). Every rank's rows are made first (about 4 MB a rank in full mode)."""
    from bisect import bisect_left

    from raysleuth.recorder.store import EvidenceStore

    store = EvidenceStore(path)
    counts: dict[str, int] = {}
    try:
        store.set_meta("run_id", Path(path).parent.name)
        written, times = [], []
        for rank in range(ranks):
            rows = rank_rows(rank, world=ranks, minutes=minutes, mode=mode, culprit=culprit, leaker=leaker,
                             straggler=straggler, seed=seed)
            for row in rows:
                counts[row[0]] = counts.get(row[0], 0) + 1
            numbered = sorted((row + (n,) for n, row in enumerate(rows)), key=lambda row: row[1])
            written.append(numbered)
            times.append([row[1] for row in numbered])
        at, edge = [0] * ranks, START + window
        while any(at[rank] < len(written[rank]) for rank in range(ranks)):
            for rank in range(ranks):
                end = bisect_left(times[rank], edge, lo=at[rank])
                if end > at[rank]:
                    store.write_batch(identity(rank, ranks), written[rank][at[rank]:end])
                    at[rank] = end
            edge += window
    finally:
        started = time.process_time()
        store.close()  # its last pass, as a writer's close
        print(f"the writer's close (its last pass): {time.process_time() - started:.2f} CPU s", flush=True)
    return counts
