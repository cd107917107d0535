"""Did the rollout engine get the trainer's weights? Weight-sync verification and rollout–trainer drift.

Every RL post-training step copies the trainer's weights into the rollout
engine. This package checks that copy on both sides, storing fingerprints
(:mod:`raysleuth.fingerprints` chunk digests), never tensors:

- :mod:`.stream`: ``rs.weights_sent`` / ``rs.weights_received``, lazy
  pass-through wrappers of the ``(name, tensor)`` stream each side moves
  (verl's CheckpointEngine gets them with no code change through
  :mod:`.verl`: every ``CheckpointEngine`` verl's registry creates);
- :mod:`.check`: ``rs.check_weight_sync``, what the engine really loaded
  (fused layouts and tensor-parallel slices from :mod:`.layouts`, a
  canonical cast between float precisions: :mod:`.prints`);
- :mod:`.compare`: the pure verdict per sync (missing, extra, dtype, shape,
  first differing chunk, stale);
- :mod:`.drift`: ``rs.logprob_gap`` and its jumps;
- :mod:`.report`: a run's syncs from the store (``raysleuth weights``).

Evidence: kind ``weight_sync`` (name = side ``sent``/``received``/
``loaded``, step = version) and ``logprob_gap``.
"""

from __future__ import annotations

from raysleuth.weights.check import WeightCheck, check_weight_sync
from raysleuth.weights.compare import SideRecord, SyncCheck, TensorDiff, compare_syncs, compare_version
from raysleuth.weights.drift import GAP_KIND, Gap, find_jumps, logprob_gap
from raysleuth.weights.layouts import Source, resolve
from raysleuth.weights.prints import WeightPrint, print_tensor
from raysleuth.weights.report import HOW_TO_RECORD, WeightsReport, build_weights_report, weights_report
from raysleuth.weights.stream import KIND, SyncSide, weights_received, weights_sent

__all__ = [
    "GAP_KIND",
    "HOW_TO_RECORD",
    "KIND",
    "Gap",
    "SideRecord",
    "Source",
    "SyncCheck",
    "SyncSide",
    "TensorDiff",
    "WeightCheck",
    "WeightPrint",
    "WeightsReport",
    "build_weights_report",
    "check_weight_sync",
    "compare_syncs",
    "compare_version",
    "find_jumps",
    "logprob_gap",
    "print_tensor",
    "resolve",
    "weights_received",
    "weights_report",
    "weights_sent",
]
