"""Rollout–trainer drift: :func:`logprob_gap` per step, and the steps where it jumps.

The rollout engine and the trainer score the same tokens; their log
probabilities differ a little (kernels, precision) and that gap stays about
level through a healthy run. When the engine runs on weights the trainer
does not have, it jumps (TRL #5312: 0.015 to 0.201 in three steps).

A step's gap is a *jump* when its mean is more than :data:`JUMP_FACTOR`
times the run's median and above it by at least :data:`JUMP_FLOOR` (so a
run whose gaps are all near zero does not alarm on noise). At least
:data:`MIN_STEPS` steps are needed for a median to mean anything.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from raysleuth.errors import UsageError

__all__ = ["GAP_KIND", "JUMP_FACTOR", "JUMP_FLOOR", "MIN_STEPS", "Gap", "find_jumps", "logprob_gap"]

GAP_KIND = "logprob_gap"
#: A step's mean gap above this many times the run's median is a jump.
JUMP_FACTOR = 3.0
#: ... and above the median by at least this much (nats).
JUMP_FLOOR = 0.01
#: Steps needed before any step is called a jump.
MIN_STEPS = 3


@dataclasses.dataclass(kw_only=True)
class Gap:
    """The rollout–trainer log-probability gap of one step."""

    step: int
    mean_abs: float
    max_abs: float
    tokens: int
    jump: bool = False
    """Well above the run's median (see :func:`find_jumps`)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dataclasses.asdict(self)


def _flat(values: Any, what: str) -> Any:
    import numpy as np

    if hasattr(values, "detach"):
        values = values.detach().float().cpu().numpy()
    try:
        array = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise UsageError(f"logprob_gap: {what} is {type(values).__name__}, not numbers",
                         fix="pass a tensor, array or list of log probabilities") from None
    return array


def logprob_gap(rollout_logprobs: Any, trainer_logprobs: Any, *, step: int, mask: Any = None,
                record: bool = True) -> Gap:
    """Record the mean and max absolute difference between the two sides' log probabilities at ``step``.

    ``mask``: which tokens count (1/True: a response token); default every token.
    """
    import numpy as np

    if isinstance(step, bool) or not isinstance(step, int):
        raise UsageError(f"logprob_gap: step={step!r} is not an int", fix="pass the trainer step")
    rollout, trainer = _flat(rollout_logprobs, "rollout_logprobs"), _flat(trainer_logprobs, "trainer_logprobs")
    if rollout.shape != trainer.shape:
        raise UsageError(f"logprob_gap: {rollout.size} rollout log probabilities, {trainer.size} trainer ones",
                         fix="pass the same tokens from both sides")
    diff = np.abs(rollout - trainer)
    if mask is not None:
        keep = _flat(mask, "mask").astype(bool)
        if keep.shape != diff.shape:
            raise UsageError("logprob_gap: the mask does not match the log probabilities", fix="one flag per token")
        diff = diff[keep]
    diff = diff[np.isfinite(diff)]
    gap = Gap(step=step, mean_abs=float(diff.mean()) if diff.size else math.nan,
              max_abs=float(diff.max()) if diff.size else math.nan, tokens=int(diff.size))
    if record:
        try:
            # the instruments here: rs.check_weight_sync and rs.weights_received, called in workers.
            # lazy: the instruments stay light to import: the recorder loads when a gap is recorded
            from raysleuth.recorder import record as write

            write(GAP_KIND, gap.to_dict(), name=GAP_KIND, step=step)
        except Exception:
            pass
    return gap


def find_jumps(gaps: list[Gap], *, factor: float = JUMP_FACTOR, floor: float = JUMP_FLOOR) -> list[Gap]:
    """Mark (and return) the steps whose gap jumps well above the run's median."""
    finite = [g.mean_abs for g in gaps if math.isfinite(g.mean_abs)]
    if len(finite) < MIN_STEPS:
        return []
    median = statistics.median(finite)
    jumps = []
    for gap in gaps:
        gap.jump = math.isfinite(gap.mean_abs) and gap.mean_abs > factor * median and gap.mean_abs > median + floor
        if gap.jump:
            jumps.append(gap)
    return jumps
