"""The stall watchdog: follows every rank's ``heartbeat`` records and names the ranks that stopped.

On the driver (or from ``raysleuth watch``), :class:`Watchdog` follows the
``heartbeat`` records in the evidence store (written by ``rs.heartbeat`` /
``rs.step`` in :mod:`raysleuth.progress`, or by the collective wrapper of
the zero-code setup). A rank whose step has not advanced for ``stall``
seconds while its peers advanced (or when every rank stopped) is
*stalled*: the watchdog takes a cluster-wide stacks snapshot, stores it as
``stack_report`` evidence, and hands a :class:`StallEvent` to ``on_stall``.
Ranks that returned from their loop have finished, not stalled.

Stall detection (:class:`StallTracker`) is pure: it takes heartbeat rows
and a clock, so it is unit tested without Ray.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from raysleuth import cluster, evidence
from raysleuth.recorder import EvidenceStore, open_store, record
from raysleuth.stacks import dump_stacks, record_report, stalled_ranks_rule
from raysleuth.stacks.clues import recorded_calls, unreturned
from raysleuth.stall.detect import (
    RankProgress, StallEvent, StallTracker, describe, describe_finish, runs_own_code,
)

__all__ = ["RankProgress", "StallEvent", "StallTracker", "Watchdog", "describe", "watchdog"]

log = logging.getLogger("raysleuth.watchdog")


# ------------------------------------------------------------- detection



class Watchdog:
    """Poll heartbeats; on a stall take stacks, store them, call ``on_stall``.

    Runs in a daemon thread (:meth:`start`) or step by step (:meth:`poll`).
    Reads the run's evidence store directly, so it runs on the head node
    (where the writer keeps the database), as drivers usually do.
    """

    def __init__(self, stall: float = 120.0, on_stall: Callable[[StallEvent], Any] | None = None, *,
                 address: str | None = None, run: str | None = None, home: str | None = None,
                 interval: float | None = None, stacks: bool = True, stacks_timeout: float = 30.0,
                 include_self: bool = True, forever: bool = True, job: str | None = None) -> None:
        self.tracker = StallTracker(stall)
        self.on_stall = on_stall
        self.address, self.run, self.home = address, run, home
        self.interval = interval if interval is not None else max(0.2, min(5.0, stall / 4))
        self.stacks, self.stacks_timeout, self.include_self = stacks, stacks_timeout, include_self
        self.forever = forever
        self.job = job
        """Only this Ray job's heartbeats (``--job``)."""
        self.events: list[StallEvent] = []
        self._done: dict[tuple, RankProgress] = {}
        self.finished: str | None = None
        """Set when every rank stopped because the training loop finished (not a stall): why we think so."""
        self.error: str | None = None
        self._after_id = 0
        self._store: EvidenceStore | None = None
        self._run_id: str | None = run
        self._reported_calls: set[tuple[Any, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading
    def _open(self):
        if self._store is None:
            run = self.run
            if run is None:
                cluster.connect(self.address)
                run = cluster.session_name()
            self._store = open_store(run, home=self.home)
            self._run_id = run
        return self._store

    def read(self) -> int:
        """Feed new heartbeat records to the tracker; returns how many were read."""
        try:
            store = self._open()
        except Exception as error:  # no run yet: nothing has heart-beaten
            self.error = str(error)
            return 0
        beats = evidence.read(store, evidence.Heartbeat, after_id=self._after_id, limit=100_000, job=self.job)
        if beats:
            self._after_id = max(beat.row.id or 0 for beat in beats)
            self.tracker.update({"rank": b.row.rank, "step": b.row.step if b.row.step is not None else b.step,
                                 "time": b.row.time, "pid": b.row.pid, "node_ip": b.row.node_ip,
                                 "actor_class": b.row.actor_class, "job_id": b.row.job_id,
                                 "source": b.source} for b in beats)
        return len(beats)

    # -- one round
    def poll(self, now: float | None = None) -> StallEvent | None:
        """Read new heartbeats; when ranks newly stalled, build (and deliver) an event."""
        self.read()
        now = time.time() if now is None else now
        stalled, peers, all_stopped = self.tracker.check(now)
        if stalled:
            self.tracker.mark_reported(stalled)
            stalled = self._alive(stalled)
        report = None
        event: StallEvent | None
        if stalled:
            event = StallEvent(time=now, stalled=stalled, peers=peers, all_stopped=all_stopped,
                               summary=describe(stalled, peers, all_stopped, now))
            finished, report = self._finished(event)
            if finished:  # these ranks returned from their loop: not a stall (peers may finish a moment later)
                self._done.update({rank.key: rank for rank in stalled})
                if set(self._done) >= set(self.tracker.ranks):
                    self.finished = describe_finish(list(self._done.values()))
                    self._record_finished(list(self._done.values()), self.finished)
                return None
        else:
            event = self._unreturned_calls(now)
            if event is None:
                return None
        if self.stacks:
            self._snapshot(event, report)
        self.events.append(event)
        if self.on_stall is not None:
            try:
                self.on_stall(event)
            except Exception:
                log.exception("raysleuth watchdog: on_stall callback failed")
        return event

    def _alive(self, ranks: list[RankProgress]) -> list[RankProgress]:
        """Drop ranks whose process is gone: a dead worker is a crash (``tasks --dead``), not a hang."""
        try:
            pids = {worker.pid for worker in cluster.workers(alive_only=True)}
        except Exception:  # no State API: keep them all rather than hide a hang
            return ranks
        gone = [rank for rank in ranks if rank.pid is not None and rank.pid not in pids]
        self.tracker.forget(gone)  # an earlier job's ranks: they never finish or stall again
        return [rank for rank in ranks if rank not in gone]

    def _unreturned_calls(self, now: float) -> StallEvent | None:
        """Calls of an instrumented verl worker group that have not returned for the stall time."""
        try:
            self._open()
            calls = unreturned(recorded_calls(self._run_id, home=self.home), older_than=self.tracker.stall, now=now)
        except Exception:
            return None
        for call in calls:
            call["rank"] = call["rank"] if call["rank"] is not None else -1
        fresh = [call for call in calls if (call["task_id"], call["rank"]) not in self._reported_calls]
        self._reported_calls.update((call["task_id"], call["rank"]) for call in fresh)
        stalled = self._alive([RankProgress(rank=call["rank"], step=None, last_beat=call["submitted"],
                                            last_progress=call["submitted"], pid=call["worker_pid"],
                                            actor_class=call["worker_name"]) for call in fresh])
        if not stalled:
            return None
        methods = {(call["rank"], call["worker_pid"]): call for call in fresh}
        summary = "; ".join(
            f"rank {rank.rank} has not returned from {methods[(rank.rank, rank.pid)]['method']} "
            f"for {rank.stalled_for(now):.0f}s (verl call)" for rank in stalled)
        return StallEvent(time=now, stalled=stalled, peers=[], all_stopped=False, summary=summary)

    def _finished(self, event: StallEvent) -> tuple[bool, Any]:
        """Did these ranks finish their loop? (None of them runs a Ray call or its own code any more.)

        Returns (finished, the stacks report taken to tell, if any). A hung
        collective keeps its actor call RUNNING (or, in Ray Train, its
        training thread in user code), so it is never taken for a finish.
        """
        pids = {rank.pid for rank in event.stalled if rank.pid is not None}
        if not pids or len(pids) < len(event.stalled):
            return False, None
        try:
            running = {task.worker_pid for task in cluster.tasks(state="RUNNING").items}
        except Exception:
            return False, None  # cannot tell: keep reporting the stall
        if pids & running:
            return False, None
        report = None
        if self.stacks:
            try:
                # judged with the stall as evidence already: if it is a stall, this is its snapshot
                report = dump_stacks(self.address, timeout=self.stacks_timeout, include_self=self.include_self,
                                     extra_rules=[_stall_rule(event)])
            except Exception:
                return False, None
            if any(proc.pid in pids and runs_own_code(proc) for proc in report.processes):
                return False, report
        return True, report

    def _record_finished(self, ranks: list[RankProgress], why: str) -> None:
        try:
            record("event", {"summary": why, "ranks": [dataclasses.asdict(r) for r in ranks]},
                   name="finished", level="INFO")
        except Exception:
            pass

    def _snapshot(self, event: StallEvent, report: Any = None) -> None:
        try:
            if report is None:  # (else the one taken to tell a finish from a stall, judged with the same rule)
                report = dump_stacks(self.address, timeout=self.stacks_timeout, include_self=self.include_self,
                                     extra_rules=[_stall_rule(event)])
            event.report = report
            record_report(report, name="watch")
        except Exception as error:  # the watchdog must never take the driver down
            event.error = f"{type(error).__name__}: {str(error)[:300]}"
        try:
            record("event", {"summary": event.summary, "stalled": [dataclasses.asdict(r) for r in event.stalled]},
                   name="stall", level="ERROR")
        except Exception:
            pass

    # -- thread
    def start(self) -> "Watchdog":
        """Watch in a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="raysleuth-watchdog", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                event = self.poll()
            except Exception as error:
                self.error = f"{type(error).__name__}: {error}"
                continue
            if event is not None and not self.forever:
                return

    def stop(self) -> None:
        """Stop watching (waits for the thread briefly)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.stacks_timeout + 5)
        if self._store is not None and (self._thread is None or not self._thread.is_alive()):
            with contextlib.suppress(Exception):
                self._store.close()
            self._store = None

    def wait(self, timeout: float | None = None) -> StallEvent | None:
        """Block until the first stall event (or timeout); returns it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.events:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.1)
        return self.events[0]

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _stall_rule(event: StallEvent):
    """No step progress for the stall time is evidence enough: a verdict rule that names these ranks itself."""

    return stalled_ranks_rule([
        {"rank": rank.rank, "pid": rank.pid, "node_ip": rank.node_ip,
         "reason": f"no heartbeat progress for {rank.stalled_for(event.time):.0f}s at {rank.unit} {rank.step}"}
        for rank in event.stalled])


def watchdog(stall: float = 120.0, on_stall: Callable[[StallEvent], Any] | None = None, **options: Any) -> Watchdog:
    """Start a stall watchdog in this process (usually the driver); returns it (``.stop()``, ``.events``)."""
    return Watchdog(stall, on_stall, **options).start()
