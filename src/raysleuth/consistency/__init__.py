"""Consistency: which rank, which tensor, which element.

Ranks that silently diverge (a wrong seed, a missed gradient all-reduce, a
failed weight sync, a data shard read twice) are found by comparing
fingerprints (:mod:`raysleuth.fingerprints`), never tensors: each rank
fingerprints its tensors on their device, the ranks meet through the
evidence writer's mailboxes (or ``torch.distributed``), and only the chunk
that disagrees is shipped to name the first differing element and the exact
max abs/rel difference.

- :mod:`~raysleuth.consistency.report` — the report and the pure comparison logic;
- :mod:`~raysleuth.consistency.exchange` — how ranks meet (mailboxes, torch.distributed);
- :mod:`~raysleuth.consistency.checks` — the checks every rank calls;
- :mod:`~raysleuth.consistency.inspect` — one tensor across ranks;
- :mod:`~raysleuth.consistency.driver` — ``compare`` and ``set_random_seed`` from the driver.

Every check is stored as evidence of kind ``consistency`` (``raysleuth consistency`` lists them).
"""

from __future__ import annotations

from raysleuth import evidence
from raysleuth.consistency.checks import (
    check_data_consistency,
    check_distributed_consistency,
    check_gradient_sync,
    verify_distributed_tensors,
)
from raysleuth.consistency.driver import SeedReport, compare, seed_everything, set_random_seed
from raysleuth.consistency.inspect import ShardInfo, TensorInspection, inspect_distributed_tensor
from raysleuth.consistency.report import ConsistencyReport, Mismatch
from raysleuth.recorder import open_store

check_consistency = check_distributed_consistency
"""Short name for :func:`check_distributed_consistency`."""

inspect_tensor = inspect_distributed_tensor
"""Short name for :func:`inspect_distributed_tensor`."""

__all__ = [
    "ConsistencyReport",
    "Mismatch",
    "SeedReport",
    "ShardInfo",
    "TensorInspection",
    "check_consistency",
    "check_data_consistency",
    "check_distributed_consistency",
    "check_gradient_sync",
    "compare",
    "inspect_distributed_tensor",
    "inspect_tensor",
    "latest_checks",
    "seed_everything",
    "set_random_seed",
    "verify_distributed_tensors",
]


def latest_checks(run: str | None = None, *, home=None, key: str | None = None, limit: int = 50,
                  jobs: list[str] | None = None):
    """Stored checks of a run (of ``jobs`` only, when given), newest first, as ``(row, ConsistencyReport)`` pairs.

    ``row``: the record's columns (:class:`raysleuth.evidence.Row`).
    """

    store = open_store(run, home=home)
    try:
        records = evidence.read(store, evidence.Consistency, name=key, job=jobs, limit=limit, newest_first=True)
    finally:
        store.close()
    checks = []
    for rec in records:
        try:
            checks.append((rec.row, ConsistencyReport.from_dict(rec.raw)))
        except (TypeError, ValueError):
            continue  # a row some other writer left under this kind: not a check
    return checks
