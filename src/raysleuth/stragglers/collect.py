"""Gather enter times and stacks for :func:`~raysleuth.stragglers.analysis.find_stragglers`: live or stored.

Live (no ``run``): asks every instrumented worker for a collectives dump
(the ``collectives.dump`` control key, as ``raysleuth collectives`` does),
reads the job's dumps of the last ``window`` seconds from the store, judges,
then samples the straggler (or the ``ranks`` asked for) and up to ``peers``
of its peers with py-spy for ``sample`` seconds and names the slow phase.
Stored (``run``): the run's dumps (periodic in full mode, at exit, on
request) over the ``window`` before its newest dump; no sampling, but a
``straggler`` record left by ``raysleuth watch --slow`` gives the phase.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, TypeVar

from raysleuth import cluster, evidence
from raysleuth.collectives.model import WINDOW_ENTRIES
from raysleuth.collectives.report import request_dump
from raysleuth.errors import UsageError
from raysleuth.recorder import open_store
from raysleuth.stragglers import sampling
from raysleuth.stragglers.analysis import MIN_COLLECTIVES, MIN_SHARE, THRESHOLD, StragglerReport, find_stragglers
from raysleuth.stragglers.phase import LEAD, SlowPhase, parse_raw, slow_phase, where
from raysleuth.stragglers.sources import calls_from_records

E = TypeVar("E", bound=evidence.Evidence)

RECORD_LIMIT = 5_000
"""Newest ``collectives`` rows read (each holds a rank's newest 256 calls per group). Scaling note: at
thousands of ranks with periodic dumps this is a few seconds of dumps; the next step is the newest dump
per rank only, in SQL."""
MISSING = ("no collectives records for this job: run it under `raysleuth run -- python train.py` (or give Ray "
           'runtime_env={"worker_process_setup_hook": "raysleuth.setup_worker"}); the workers then record every '
           "collective's enter time (Flight Recorder and the collective wrapper)")


@dataclasses.dataclass(kw_only=True)
class Options:
    """What :func:`collect_stragglers` is asked."""

    window: float = 30.0
    """Seconds of collectives judged (the newest)."""
    ranks: list[int] | None = None
    """Ranks to sample (default: the stragglers found); each must be a rank of the job."""
    threshold: float = THRESHOLD
    min_collectives: int = MIN_COLLECTIVES
    min_share: float = MIN_SHARE
    sample: float = sampling.SECONDS
    """Seconds of py-spy sampling (0: none)."""
    rate: int = sampling.RATE
    rounds: int = sampling.ROUNDS
    """Most rounds of ``sample`` seconds taken while a phase is not clear."""
    peers: int = 2
    """Peers sampled for contrast."""
    wait: float = 4.0
    """Seconds to wait for the workers' dumps."""
    progress: Callable[[str], None] | None = None
    """Told what the check does now, before each round of sampling (a line; the CLI's spinner on a terminal)."""


def _records(store, kind: type[E], job: str | None, since: float | None) -> list[E]:
    """The newest :data:`RECORD_LIMIT` records of ``kind`` since ``since``, oldest first."""
    return list(reversed(evidence.read(store, kind, job=job, limit=RECORD_LIMIT, newest_first=True, since=since)))


def _request(store, job: str | None, wait: float, home) -> None:
    """Ask for a dump and wait until every rank that dumped before has answered (or ``wait`` passes)."""

    request_id, asked_at = request_dump(wait, home=home, limit=WINDOW_ENTRIES)  # the window's calls, not only 64
    if request_id is None:
        return
    before = {(r.row.node_ip, r.row.pid) for r in _records(store, evidence.Collectives, job, time.time() - 600)}
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        got = {(r.row.node_ip, r.row.pid) for r in _records(store, evidence.Collectives, job, asked_at - 1)
               if (r.request or {}).get("id") == request_id}
        if before and before <= got:
            return
        time.sleep(0.3)


def step_seconds(heartbeats: list[evidence.Heartbeat]) -> dict[int, float]:
    """Per rank, the median time between two ``rs.step`` heartbeats (per step), from the job's own steps."""
    times: dict[int, dict[int, float]] = defaultdict(dict)
    for beat in heartbeats:
        rank, step = beat.row.rank, beat.row.step
        if beat.source == "collectives" or rank is None or step is None:
            continue
        times[rank].setdefault(int(step), float(beat.row.time or 0))
    result = {}
    for rank, by_step in times.items():
        steps = sorted(by_step)
        gaps = [(by_step[b] - by_step[a]) / (b - a) for a, b in zip(steps, steps[1:]) if b > a]
        if len(gaps) >= 2:
            result[rank] = statistics.median(gaps)
    return result


def collect_stragglers(address: str | None = None, *, run: str | None = None, home: Path | str | None = None,
                       job: str | None = None, options: Options | None = None) -> StragglerReport:
    """Which rank is slow, by how much, and (live) where: see the module doc."""

    options = options or Options()
    if options.window <= 0:
        raise UsageError(f"--window must be > 0 (got {options.window:g})", fix="e.g. --window 30s")
    live = run is None
    if live:
        cluster.connect(address)
        run = cluster.session_name()
    store = open_store(run, home=home)
    try:
        if live:
            _request(store, job, options.wait, home)
        newest = store.query("collectives", job=job, limit=1, newest_first=True)
        end = time.time() if live or not newest else newest[0].time
        since = end - options.window
        records = _records(store, evidence.Collectives, job, since - 5.0)
        beats = _records(store, evidence.Heartbeat, job, since)
        stored = [] if live else _records(store, evidence.StragglerRun, None, since)  # the CLI's: not the job's id
    finally:
        store.close()
    report = judge(records, beats, job=job, options=options, since=since)
    report.run, report.live = run, live
    _check_ranks(report, options.ranks)
    if live and report.state != "unread" and options.sample > 0:
        sample_phases(report, options)
    elif not live:
        _stored_phases(report, stored)
    return report


def judge(records: list[evidence.Collectives], beats: list[evidence.Heartbeat], *, job: str | None,
          options: Options, since: float) -> StragglerReport:
    """The verdict from stored records: pure apart from the clock."""
    calls = calls_from_records(records, job)
    pids = set(calls.pids.values())
    beats = [beat for beat in beats if beat.row.pid in pids]
    report = find_stragglers(calls.calls, threshold=options.threshold, min_collectives=options.min_collectives,
                             min_share=options.min_share, since_ns=int(since * 1e9), nodes=calls.nodes,
                             pids=calls.pids, step_seconds=step_seconds(beats), source=calls.source)
    report.job_id, report.window_s = calls.job_id, options.window
    report.sampling = {"node_ids": {str(k): v for k, v in calls.node_ids.items()}}
    if not calls.calls:
        report.missing.append(MISSING)
        report.summary = "no collectives recorded: nothing to judge"
    elif report.state == "unread":
        report.missing.append(f"fewer than {options.min_collectives} collectives entered by every rank in the last "
                              f"{options.window:g}s: let the job run longer or widen --window")
    if report.state == "straggler":
        report.next_command = f"raysleuth stragglers --rank {report.stragglers[0].rank}"
    return report


def _check_ranks(report: StragglerReport, ranks: list[int] | None) -> None:
    known = {t.rank for t in report.ranks} or {int(r) for r in (report.sampling or {}).get("node_ids", {})}
    unknown = sorted(set(ranks or ()) - known)
    if unknown and known:
        raise UsageError(f"rank {', '.join(map(str, unknown))} is not a rank of job {report.job_id} "
                         f"(its ranks: {', '.join(map(str, sorted(known)))})", fix="pick one of those ranks")
    if unknown:
        raise UsageError(f"rank {', '.join(map(str, unknown))}: this job recorded no collectives, so it has no "
                         "ranks to pick from", fix="run the job under `raysleuth run`, then ask again")


def sample_phases(report: StragglerReport, options: Options) -> None:
    """Sample the suspects and a few peers; attach each suspect's slow phase (and the cost) to the report.

    Rounds of ``options.sample`` seconds, each adding its samples to the last, until every suspect's phase is
    clear (:attr:`SlowPhase.clear`) or ``options.rounds`` were taken; a phase still unclear is not named.
    """
    node_ids = {int(k): v for k, v in (report.sampling or {}).get("node_ids", {}).items()}
    pids = {t.rank: t.pid for t in report.ranks if t.pid}
    suspects = list(options.ranks or [s.rank for s in report.stragglers])
    if not suspects:
        return
    by_lateness = sorted(report.ranks, key=lambda t: t.median_lateness_s)
    peers = [t.rank for t in by_lateness if t.rank not in suspects][:max(1, options.peers)]
    targets = {rank: (node_id, pids[rank]) for rank in suspects + peers
               if rank in pids and (node_id := node_ids.get(rank))}
    texts: dict[int, str] = {}
    phases: dict[int, SlowPhase | None] = {}
    errors: dict[int, str] = {}
    failed: dict[int, int] = {}
    rounds, wall = 0, 0.0
    while True:
        if options.progress is not None:
            options.progress(f"sampling rank {', '.join(map(str, suspects))} and {len(peers)} peer(s) with py-spy "
                             f"for {options.sample:g}s" + (f": round {rounds + 1} of up to {options.rounds}, the slow "
                                                           "phase is not clear yet" if rounds else ""))
        found, round_errors, cost = sampling.sample_processes(targets, rate=options.rate, seconds=options.sample)
        rounds, wall = rounds + 1, wall + cost["wall_s"]
        errors.update(round_errors)
        for rank, text in found.items():
            texts[rank] = f"{texts[rank]}\n{text}" if rank in texts else text
        for rank in targets.keys() - found.keys():
            failed[rank] = failed.get(rank, 0) + 1
        # A rank that failed once is tried again in the next round (a py-spy that timed out on a loaded node).
        targets = {rank: target for rank, target in targets.items() if failed.get(rank, 0) < 2}
        phases = _phases(texts, suspects, peers)
        pending = [rank for rank in suspects if rank in targets
                   and (rank not in texts or (phase := phases.get(rank)) is not None and not phase.clear)]
        if rounds >= options.rounds or not pending:
            break
    errors = {rank: error for rank, error in errors.items() if rank not in texts}
    cost.update(rounds=rounds, wall_s=wall, sampled=len(texts), errors={str(k): v for k, v in errors.items()})
    report.sampling = {**(report.sampling or {}), **cost, "suspects": suspects, "peers": peers}
    for straggler in report.stragglers:
        phase = phases.get(straggler.rank)
        straggler.phase = phase if phase is not None and phase.clear else None
    report.sampling["phases"] = {str(rank): {**dataclasses.asdict(phase), "clear": phase.clear} if phase else None
                                 for rank, phase in phases.items()}
    for rank, phase in phases.items():
        if phase is not None and not phase.clear:
            report.notes.append(_unclear(rank, phase, options))
    for rank, error in errors.items():
        report.notes.append(f"rank {rank} not sampled: {error}")


def _phases(texts: dict[int, str], suspects: list[int], peers: list[int]) -> dict[int, SlowPhase | None]:
    threads = {rank: parse_raw(text) for rank, text in texts.items()}
    peer_threads = [threads[rank] for rank in peers if rank in threads]
    return {rank: slow_phase(threads[rank], peer_threads, sampling.library_dirs()) for rank in suspects
            if rank in threads}


def _unclear(rank: int, phase: SlowPhase, options: Options) -> str:
    runner = phase.runner_up or {}
    other = (f"{runner.get('function')} ({where(runner.get('file'), runner.get('line'))}, "
             f"{runner.get('share', 0):.0%} against {runner.get('peer_share', 0):.0%})" if runner else "no slow place at all")
    return (f"rank {rank}: no slow phase named, {phase.samples} samples cannot tell {phase.function} ({phase.where}, "
            f"{phase.share:.0%} of its samples against its peers' {phase.peer_share:.0%}) from {other}: "
            f"a lead of {phase.lead or 0:.1f} standard errors, {LEAD:g} needed; sample longer: raysleuth stragglers "
            f"--rank {rank} --sample {max(60.0, options.sample * options.rounds * 2):g}s")


def _stored_phases(report: StragglerReport, stored: list[evidence.StragglerRun]) -> None:
    """A stored run: the slow phase from the newest ``straggler`` record of each rank, where there is one."""
    for straggler in report.stragglers:
        for row in reversed(stored):
            if report.job_id and row.job_id not in (None, report.job_id):
                continue
            phase = next((s.phase for s in row.stragglers if s.rank == straggler.rank and s.phase), None)
            straggler.phase = phase_from(phase)
            if straggler.phase is not None:
                break
    if report.stragglers and not any(s.phase for s in report.stragglers):
        report.notes.append("stored run: the slow phase needs the live job (stack samples); "
                            "`raysleuth watch --slow` records it while the job runs")


def phase_from(part: evidence.SlowPhasePart | None) -> SlowPhase | None:
    """A stored slow phase back as a :class:`SlowPhase`; None when a field it needs was not stored."""
    if part is None or None in (part.function, part.file, part.thread, part.line, part.share, part.peer_share,
                                part.samples, part.peer_samples):
        return None
    wait = part.peers_wait
    kept = wait.to_data() if wait is not None and wait.file is not None and wait.share is not None else None
    return SlowPhase(function=str(part.function), file=str(part.file), line=int(part.line or 0),
                     share=float(part.share or 0.0), peer_share=float(part.peer_share or 0.0), stack=list(part.stack),
                     thread=str(part.thread), samples=int(part.samples or 0), peer_samples=int(part.peer_samples or 0),
                     peers_wait=kept, lead=part.lead)
