"""Every benchmark states its targets through :func:`target` and exits with :func:`exit_code`.

A missed target makes the benchmark exit 1 (so ``make bench`` and CI see it);
``RAYSLEUTH_BENCH_FORCE_MISS=1`` counts every target as missed, which the
test suite uses to check that each benchmark really exits non-zero.
"""

from __future__ import annotations

import os

_missed: list[str] = []
_checked: list[str] = []


def target(label: str, ok: bool, detail: str = "") -> bool:
    """Print one target's verdict (PASS/MISS); remember a miss. Returns ``ok``."""
    if os.environ.get("RAYSLEUTH_BENCH_FORCE_MISS"):
        ok = False
    _checked.append(label)
    print(f"target {label}: {detail} -> {'PASS' if ok else 'MISS'}", flush=True)
    if not ok:
        _missed.append(label)
    return ok


def exit_code() -> int:
    """1 when any target was missed (or none was checked), else 0; prints the tally."""
    if not _checked:
        print("no target was checked -> MISS", flush=True)
        return 1
    if _missed:
        print(f"missed {len(_missed)} of {len(_checked)} target(s): {', '.join(_missed)}", flush=True)
        return 1
    print(f"all {len(_checked)} target(s) met", flush=True)
    return 0
