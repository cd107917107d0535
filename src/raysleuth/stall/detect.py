"""Stall detection, pure: heartbeat rows and a clock in, stalled or finished ranks out (no Ray, no I/O)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from raysleuth.errors import UsageError

__all__ = ["RankProgress", "StallEvent", "StallTracker", "describe", "describe_finish", "runs_own_code"]


_LIBRARY_PARTS = ("site-packages", "dist-packages", "/lib/python3", "raysleuth/", "<frozen")


def runs_own_code(proc: Any) -> bool:
    """A thread of this process is in code of its own (not Ray's, a library's or the stdlib's)."""
    for thread in getattr(proc, "threads", None) or []:
        if str(getattr(thread, "name", "")).startswith("TrainingThread"):
            return True  # Ray Train's thread running the user's train function
        for frame in getattr(thread, "frames", None) or []:
            path = str(getattr(frame, "file", "") or "")
            if path and not any(part in path for part in _LIBRARY_PARTS):
                return True
    return False


@dataclasses.dataclass
class RankProgress:
    """What the watchdog knows about one rank."""

    rank: int
    step: int | None
    last_beat: float
    """Time of the newest heartbeat."""
    last_progress: float
    """Time the step last advanced (first heartbeat counts)."""
    pid: int | None = None
    node_ip: str | None = None
    actor_class: str | None = None
    job_id: str | None = None
    unit: str = "step"
    """What ``step`` counts: ``step`` (``rs.step``/``rs.heartbeat``) or ``collective`` (completed collectives,
    from the collective wrapper of the zero-code setup)."""

    @property
    def key(self) -> tuple:
        """Who this is: one process of one job. Two processes with one rank number (two verl groups, two
        jobs) are two ranks; a restarted rank is a new process."""
        return (self.job_id, self.node_ip, self.pid if self.pid is not None else f"rank {self.rank}")

    def stalled_for(self, now: float) -> float:
        """Seconds since the step last advanced."""
        return max(0.0, now - self.last_progress)


@dataclasses.dataclass
class StallEvent:
    """Ranks that stopped making progress, with the stacks taken at that moment."""

    time: float
    stalled: list[RankProgress]
    peers: list[RankProgress]
    all_stopped: bool
    summary: str
    report: Any = None
    """The :class:`raysleuth.stacks.StackReport` taken at the stall (``None`` if it failed)."""
    error: str | None = None
    """Why no stack report could be taken."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict."""
        data = dataclasses.asdict(self)
        data["report"] = self.report.to_dict() if self.report is not None else None
        return data


class StallTracker:
    """Follows heartbeats per process (one rank of one job) and says which are stalled."""

    def __init__(self, stall: float) -> None:
        if stall <= 0:
            raise UsageError(f"stall must be a positive number of seconds, got {stall!r}", fix="e.g. --stall 120")
        self.stall = stall
        self.ranks: dict[tuple, RankProgress] = {}
        """Keyed by :attr:`RankProgress.key` (job, node, pid): never by the rank number alone."""
        self.reported: set[tuple] = set()

    def update(self, beats: Iterable[dict[str, Any]]) -> None:
        """Feed heartbeat rows: dicts with rank, step, time (pid, node_ip, actor_class, job_id, source optional)."""
        for beat in beats:
            rank = beat.get("rank")
            if rank is None:
                continue
            when, step_now = float(beat["time"]), beat.get("step")
            fresh = RankProgress(rank=rank, step=step_now, last_beat=when, last_progress=when, pid=beat.get("pid"),
                                 node_ip=beat.get("node_ip"), actor_class=beat.get("actor_class"),
                                 job_id=beat.get("job_id"),
                                 unit="collective" if beat.get("source") == "collectives" else "step")
            known = self.ranks.get(fresh.key)
            if known is None:
                self._retire(fresh)
                self.ranks[fresh.key] = fresh
                continue
            known.last_beat = max(known.last_beat, when)
            if step_now is not None and (known.step is None or step_now > known.step):
                known.step, known.last_progress = step_now, when
                self.reported.discard(known.key)  # it moved again: report it anew if it stalls later

    def _retire(self, fresh: RankProgress) -> None:
        """A new process on a rank of the same job that the old one left a while ago: a restart (or the next job
        of a reused run); the old one's progress says nothing about it. Processes beating at the same time with
        one rank number (two worker groups) are both kept."""
        gap = min(self.stall, 5.0)
        for key, old in list(self.ranks.items()):
            if (old.job_id, old.rank) == (fresh.job_id, fresh.rank) and old.last_beat < fresh.last_beat - gap:
                del self.ranks[key]
                self.reported.discard(key)

    def check(self, now: float) -> tuple[list[RankProgress], list[RankProgress], bool]:
        """(newly stalled processes, the others of their jobs, every one of those jobs stopped)."""
        if not self.ranks:
            return [], [], False
        late = [r for r in self.ranks.values() if r.stalled_for(now) >= self.stall]
        fresh = [r for r in late if r.key not in self.reported]
        jobs = {r.job_id for r in fresh}
        mates = [r for r in self.ranks.values() if r.job_id in jobs]
        others = [r for r in mates if r not in late]
        stopped = bool(fresh) and all(r in late for r in mates)
        order = lambda r: (r.rank, str(r.job_id), r.pid or 0)  # noqa: E731
        return sorted(fresh, key=order), sorted(others, key=order), stopped

    def forget(self, ranks: Iterable[RankProgress]) -> None:
        """Stop following these processes (they are gone)."""
        for rank in ranks:
            self.ranks.pop(rank.key, None)
            self.reported.discard(rank.key)

    def mark_reported(self, ranks: Iterable[RankProgress]) -> None:
        """Do not report these processes again until they advance."""
        self.reported.update(r.key for r in ranks)


def _at(ranks: list[RankProgress]) -> str:
    steps = sorted({rank.step for rank in ranks if rank.step is not None})
    unit = "collective" if ranks and all(r.unit == "collective" for r in ranks) else "step"
    if not steps:
        return ""
    if len(steps) == 1:
        return f" at {unit} {steps[0]:g}" if isinstance(steps[0], float) else f" at {unit} {steps[0]}"
    return f" at {unit}s {steps[0]}-{steps[-1]}" if len(steps) > 4 else f" at {unit}s {steps}"


def describe_finish(ranks: list[RankProgress]) -> str:
    at = _at(ranks)
    if len({r.step for r in ranks if r.step is not None}) > 1:
        steps = sorted({r.step for r in ranks if r.step is not None})
        at = f" at {'collective' if all(r.unit == 'collective' for r in ranks) else 'step'}s {steps[0]}-{steps[-1]}"
    return (f"finished: every rank stopped{at} and none is running a call or its own code "
            f"(the training loop returned; the actors are still alive)")


def describe(stalled: list[RankProgress], peers: list[RankProgress], all_stopped: bool, now: float) -> str:
    """One line: ``rank 2 stalled at step 5 for 12s while peers reached step 40``."""
    ranks = ", ".join(str(r.rank) for r in stalled)
    worst = max(r.stalled_for(now) for r in stalled)
    at = _at(stalled)
    word = "rank" if len(stalled) == 1 else "ranks"
    if all_stopped:
        return f"every rank stopped: {word} {ranks}{at}, no progress for {worst:.0f}s"
    best = max((r.step for r in peers if r.step is not None), default=None)
    unit = "collective" if peers and all(r.unit == "collective" for r in peers) else "step"
    peers_text = f" while peers reached {unit} {best}" if best is not None else " while peers progressed"
    return f"{word} {ranks} stalled{at} for {worst:.0f}s{peers_text}"


# --------------------------------------------------------------- watchdog
