"""The report's weight-sync section: each sync's verdict with the logprob gap beside it.

A pure builder over ``weight_sync`` and ``logprob_gap`` records, using the
same verdicts as ``raysleuth weights`` (:func:`raysleuth.weights.build_weights_report`).
"""

from __future__ import annotations

from typing import Any

from raysleuth.weights import build_weights_report

__all__ = ["weights_section"]


def weights_section(records: list) -> dict[str, Any]:
    """``{"syncs": [row...], "jumps": [...], "intact": bool | None}``: one row per sync, oldest first."""
    report = build_weights_report(records)
    rows = []
    for sync in report.syncs:
        gap = report.gap_at(sync.version)
        first = next((d for d in sync.diffs if d.kind not in ("missing", "extra")), None)
        rows.append({
            "step": sync.version, "status": sync.status, "intact": sync.intact, "sent": sync.sent,
            "received": "/".join(str(n) for n in sync.received) or "0",
            "gap": None if gap is None else f"{gap.mean_abs:.4g}", "jump": bool(gap and gap.jump),
            "missing": sync.missing[:10], "extra": sync.extra[:10], "casts": len(sync.casts),
            "first": None if first is None else first.describe(), "more": max(0, len(sync.diffs) - 1),
            "notes": sync.notes[:3],
        })
    return {"syncs": rows, "jumps": report.jumps,
            "intact": (not report.problem) if report.syncs else None}
