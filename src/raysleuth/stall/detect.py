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
    """Follows heartbeats per rank and says which ranks are stalled."""

    def __init__(self, stall: float) -> None:
        if stall <= 0:
            raise UsageError(f"stall must be a positive number of seconds, got {stall!r}", fix="e.g. --stall 120")
        self.stall = stall
        self.ranks: dict[int, RankProgress] = {}
        self.reported: set[int] = set()

    def update(self, beats: Iterable[dict[str, Any]]) -> None:
        """Feed heartbeat rows: dicts with rank, step, time (pid, node_ip, actor_class optional)."""
        for beat in beats:
            rank = beat.get("rank")
            if rank is None:
                continue
            when, step_now = float(beat["time"]), beat.get("step")
            known = self.ranks.get(rank)
            pid = beat.get("pid")
            if known is not None and pid is not None and known.pid is not None and pid != known.pid \
                    and when >= known.last_beat:
                # A new process took this rank (a restart, or the next job in the same run): its
                # steps start again, so the old process's progress says nothing about it.
                self.reported.discard(rank)
                known = None
            if known is None:
                self.ranks[rank] = RankProgress(rank=rank, step=step_now, last_beat=when, last_progress=when,
                                                pid=beat.get("pid"), node_ip=beat.get("node_ip"),
                                                actor_class=beat.get("actor_class"))
                continue
            known.last_beat = max(known.last_beat, when)
            known.pid, known.node_ip = beat.get("pid") or known.pid, beat.get("node_ip") or known.node_ip
            if step_now is not None and (known.step is None or step_now > known.step):
                known.step, known.last_progress = step_now, when
                self.reported.discard(rank)  # it moved again: report it anew if it stalls later

    def check(self, now: float) -> tuple[list[RankProgress], list[RankProgress], bool]:
        """(newly stalled ranks, the others, every rank stopped)."""
        if not self.ranks:
            return [], [], False
        late = [r for r in self.ranks.values() if r.stalled_for(now) >= self.stall]
        fresh = [r for r in late if r.rank not in self.reported]
        others = [r for r in self.ranks.values() if r not in late]
        return sorted(fresh, key=lambda r: r.rank), sorted(others, key=lambda r: r.rank), len(late) == len(self.ranks)

    def mark_reported(self, ranks: Iterable[RankProgress]) -> None:
        """Do not report these ranks again until they advance."""
        self.reported.update(r.rank for r in ranks)


def describe_finish(ranks: list[RankProgress]) -> str:
    steps = sorted({rank.step for rank in ranks if rank.step is not None})
    at = f" at step {steps[0]}" if len(steps) == 1 else (f" at steps {steps[0]}-{steps[-1]}" if steps else "")
    return (f"finished: every rank stopped{at} and none is running a call or its own code "
            f"(the training loop returned; the actors are still alive)")


def describe(stalled: list[RankProgress], peers: list[RankProgress], all_stopped: bool, now: float) -> str:
    """One line: ``rank 2 stalled at step 5 for 12s while peers reached step 40``."""
    ranks = ", ".join(str(r.rank) for r in stalled)
    worst = max(r.stalled_for(now) for r in stalled)
    steps = sorted({r.step for r in stalled if r.step is not None})
    at = f" at step {steps[0]}" if len(steps) == 1 else (f" at steps {steps}" if steps else "")
    word = "rank" if len(stalled) == 1 else "ranks"
    if all_stopped:
        return f"every rank stopped: {word} {ranks}{at}, no progress for {worst:.0f}s"
    best = max((r.step for r in peers if r.step is not None), default=None)
    peers_text = f" while peers reached step {best}" if best is not None else " while peers progressed"
    return f"{word} {ranks} stalled{at} for {worst:.0f}s{peers_text}"


# --------------------------------------------------------------- watchdog
