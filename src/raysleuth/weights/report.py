"""A run's syncs and drift, from the store: :func:`weights_report` (what ``raysleuth weights`` shows).

Reads ``weight_sync`` and ``logprob_gap`` records (the cluster may be
gone), compares each version's sides (:mod:`.compare`), puts each step's
gap beside the sync it ran on, and says where a gap jump points: at the
sync just before it when that sync is not intact, elsewhere (kernels,
sampling settings) when every sync up to it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth import evidence
from raysleuth.weights.compare import SideRecord, SyncCheck, compare_syncs
from raysleuth.weights.drift import GAP_KIND, Gap, find_jumps
from raysleuth.weights.stream import KIND

__all__ = ["HOW_TO_RECORD", "WeightsReport", "build_weights_report", "weights_report"]

HOW_TO_RECORD = ("run the job under `raysleuth run -- python train.py` (verl's CheckpointEngine is checked with no "
                 "code change), or wrap each side in one line: rs.weights_sent(named_tensors, version=step) in the "
                 "trainer, rs.weights_received(named_tensors, version=step) in the rollout worker")


@dataclasses.dataclass(kw_only=True)
class WeightsReport:
    """Every sync of a run with its verdict, and the drift beside it."""

    syncs: list[SyncCheck]
    gaps: list[Gap]
    jumps: list[dict[str, Any]]
    """Per jump: ``step``, ``mean_abs``, ``median``, ``sync`` (the version before it or None), ``verdict``."""
    skipped: int = 0
    """Stored rows that were not readable weight_sync / logprob_gap records."""

    @property
    def problem(self) -> bool:
        """Any sync not intact, or a jump."""
        return any(not sync.intact for sync in self.syncs) or bool(self.jumps)

    def gap_at(self, version: int) -> Gap | None:
        """The gap of the first step at or after ``version`` and before the next sync."""
        later = sorted(s.version for s in self.syncs if s.version > version)
        stop = later[0] if later else None
        for gap in self.gaps:
            if gap.step >= version and (stop is None or gap.step < stop):
                return gap
        return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"syncs": [dict(s.to_dict(), gap=(g.to_dict() if (g := self.gap_at(s.version)) else None))
                          for s in self.syncs],
                "gaps": [g.to_dict() for g in self.gaps], "jumps": self.jumps, "skipped": self.skipped,
                "intact": bool(self.syncs) and not any(not s.intact for s in self.syncs), "problem": self.problem}


_PHRASE = {"stale": "stale (the rollout kept the old weights)", "differs": "not intact (tensors differ)",
           "unreceived": "never received", "unsent": "unverified (no sender recorded)",
           "incomplete": "incomplete"}


def _jump_verdicts(syncs: list[SyncCheck], gaps: list[Gap], jumps: list[Gap]) -> list[dict[str, Any]]:
    import statistics

    median = statistics.median([g.mean_abs for g in gaps if g.mean_abs == g.mean_abs]) if gaps else None
    verdicts = []
    for jump in jumps:
        before = [s for s in syncs if s.version <= jump.step]
        sync = before[-1] if before else None
        if sync is not None and not sync.intact:
            state = _PHRASE.get(sync.status, sync.status)
            verdict = f"the sync of version {sync.version} just before it is {state}: look there first"
        elif before and all(s.intact for s in before):
            verdict = (f"every sync up to step {jump.step} is intact: the weights arrived as sent, so the cause is "
                       "elsewhere (kernels, precision, sampling settings)")
        else:
            verdict = "no intact sync recorded before this step: record the syncs to tell weights from other causes"
        verdicts.append({"step": jump.step, "mean_abs": jump.mean_abs, "median": median,
                         "sync": None if sync is None else sync.version, "verdict": verdict})
    return verdicts


def _within(steps: Any, step: int) -> bool:
    low, high = steps
    return (low is None or step >= low) and (high is None or step <= high)


def build_weights_report(records: list, *, steps: Any = None) -> WeightsReport:
    """From stored records (``Record`` objects of both kinds, any order); ``steps``: a StepRange to keep."""
    sides, gaps, skipped = [], [], 0
    for rec in records:
        try:
            if rec.kind == KIND:
                sides.append(SideRecord.from_data(evidence.WeightSync.from_record(rec).raw, time_=rec.time, rank=rec.rank,
                                                  pid=rec.pid))
            elif rec.kind == GAP_KIND:
                gap = evidence.LogprobGap.from_record(rec)
                if gap.step is None or gap.mean_abs is None or gap.max_abs is None:
                    raise ValueError("not a stored logprob gap (needs step, mean_abs, max_abs)")
                gaps.append(Gap(step=gap.step, mean_abs=gap.mean_abs, max_abs=gap.max_abs, tokens=gap.tokens or 0))
        except (TypeError, ValueError, KeyError, AttributeError):
            skipped += 1
    gaps.sort(key=lambda g: g.step)
    syncs = compare_syncs(sides)
    jumps = _jump_verdicts(syncs, gaps, find_jumps(gaps))
    if steps is not None:
        syncs = [s for s in syncs if _within(steps, s.version)]
        gaps = [g for g in gaps if _within(steps, g.step)]
        jumps = [j for j in jumps if _within(steps, j["step"])]
    return WeightsReport(syncs=syncs, gaps=gaps, jumps=jumps, skipped=skipped)


def weights_report(run: str | None = None, *, home: Any = None, steps: Any = None,
                   jobs: list[str] | None = None) -> WeightsReport:
    """The syncs of ``run`` (default: the latest), read from its evidence store."""
    # the instruments here: rs.check_weight_sync and rs.weights_received, called in workers.
    # lazy: the instruments stay light to import: the recorder loads when syncs are read
    from raysleuth.recorder import open_store

    store = open_store(run, home=home)
    try:
        records = store.query([KIND, GAP_KIND], job=jobs)
    finally:
        store.close()
    return build_weights_report(records, steps=steps)
