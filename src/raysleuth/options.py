"""The one home of the command line's value parsers: ranks, step ranges, durations, moments.

Pure functions (no Ray, no typer): ``cli._app`` builds the shared options
(``--rank``/``--ranks``, ``--step``/``--steps``, durations, ``--since``)
on them, and the features that take the same text (``LogQuery``) call them
too. Bad input raises :class:`~raysleuth.errors.UsageError` with a fix, which
the command line prints as one red line (exit 2).
"""

from __future__ import annotations

import datetime
import math
import re
import time
from collections.abc import Iterable
from typing import NamedTuple

from raysleuth.errors import UsageError

__all__ = [
    "MAX_RANK",
    "StepRange",
    "format_ranks",
    "merge_ranks",
    "parse_duration",
    "parse_ranks",
    "parse_since",
    "parse_steps",
]

#: Largest rank or step taken (SQLite integers; a rank past this is a typo).
MAX_RANK = 2**31 - 1
_MAX_STEP = 2**63 - 1
_MAX_RANGE = 1_000_000
_MAX_SECONDS = 2.0**53

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_STEPS = re.compile(r"^\s*([0-9]+)?\s*(-)?\s*([0-9]+)?\s*$")


class StepRange(NamedTuple):
    """An inclusive step range; ``None`` leaves that end open."""

    low: int | None
    high: int | None


def _show(text: object) -> str:
    """The value as the user wrote it, cut short enough for one line."""
    shown = str(text)
    return repr(shown if len(shown) <= 40 else shown[:37] + "...")


def _rank(text: str, whole: str, option: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise UsageError(f"{option} {_show(whole)} is not a list of ranks",
                         fix=f"write e.g. {option} 3, {option} 0,1 or {option} 4-7")
    value = int(text) if len(text) <= 12 else MAX_RANK + 1
    if value > MAX_RANK:
        raise UsageError(f"{option} {_show(whole)}: the rank is too large", fix=f"ranks go up to {MAX_RANK}")
    return value


def parse_ranks(text: str | None, *, option: str = "--rank") -> list[int] | None:
    """``"0,2-4"`` -> ``[0, 2, 3, 4]`` (sorted, no repeats); ``None`` or blank -> ``None`` (every rank)."""
    if text is None or not text.strip():
        return None
    ranks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        first = _rank(low.strip(), text, option)
        last = _rank(high.strip(), text, option) if dash else first
        if last < first:
            raise UsageError(f"{option} {_show(text)}: the range {_show(part)} ends before it starts",
                             fix=f"write it low-high, e.g. {last}-{first}")
        if last - first >= _MAX_RANGE:
            raise UsageError(f"{option} {_show(text)}: the range {_show(part)} is too wide",
                             fix=f"name at most {_MAX_RANGE:,} ranks in one range")
        ranks.update(range(first, last + 1))
    return sorted(ranks)


def format_ranks(ranks: Iterable[int], *, limit: int = 12) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``, the inverse of :func:`parse_ranks`; past ``limit`` ranges,
    the first ones and ``… (N ranks in all)``. Output stays short at any world size."""
    ordered = sorted(set(ranks))
    runs: list[str] = []
    start = previous = None
    for rank in ordered + [None]:
        if rank is not None and previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            runs.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = rank
    if len(runs) > limit:
        return ",".join(runs[:limit]) + f",… ({len(ordered)} ranks in all)"
    return ",".join(runs)


def merge_ranks(lists: Iterable[Iterable[int] | None] | None) -> list[int] | None:
    """Several rank lists (``--rank 0 --rank 2,3 --ranks 4-5``) as one sorted list; ``None`` when none given."""
    merged = {rank for ranks in lists or () for rank in ranks or ()}
    return sorted(merged) if merged else None


def parse_steps(text: str | tuple[int | None, int | None] | None, *, option: str = "--step") -> StepRange | None:
    """``"10-20"`` -> (10, 20); ``"10"`` -> (10, 10); ``"10-"`` / ``"-20"`` open-ended; ``None`` or blank -> ``None``.

    A pair (already parsed) comes back as a :class:`StepRange`.
    """
    if isinstance(text, tuple):
        return StepRange(*text)
    if text is None or not text.strip():
        return None
    match = _STEPS.match(text)
    if not match or (match.group(1) is None and match.group(3) is None):
        raise UsageError(f"{option} {_show(text)} is not a step or a step range",
                         fix=f"write e.g. {option} 10-20, {option} 10, {option} 10- or {option} -20")
    low, high = (None if digits is None else int(digits) if len(digits) <= 19 else _MAX_STEP + 1
                 for digits in (match.group(1), match.group(3)))
    if match.group(2) is None:
        high = low
    if any(value is not None and value > _MAX_STEP for value in (low, high)):
        raise UsageError(f"{option} {_show(text)}: the step is too large", fix=f"steps go up to {_MAX_STEP}")
    if low is not None and high is not None and high < low:
        raise UsageError(f"{option} {_show(text)} ends before it starts", fix=f"write it low-high, e.g. {high}-{low}")
    return StepRange(low, high)


def parse_duration(text: str | float | int, *, option: str = "duration") -> float:
    """``"30s"``, ``"5m"``, ``"2h"``, ``"1d"``, ``"500ms"`` or ``"1.5"`` (seconds) -> seconds.

    A number (an option's default) is taken as seconds.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text))
        if not match:
            raise UsageError(f"{option} {_show(text)} is not a duration",
                             fix="write it like 30s, 5m, 2h, 1d, 500ms or 1.5")
        seconds = float(match.group(1)) * _UNIT[(match.group(2) or "s").lower()]
    if not math.isfinite(seconds) or seconds < 0 or seconds >= _MAX_SECONDS:
        raise UsageError(f"{option} {_show(text)} is not a usable duration", fix="write it like 30s, 5m or 2h")
    return seconds


def parse_since(text: str | float | None, *, now: float | None = None, option: str = "--since") -> float | None:
    """A duration ago (``"10m"``, ``"2h"``, ``"1d"``) or an ISO time -> a Unix time; ``None`` or blank -> ``None``.

    A number that is not text is taken as a Unix time already.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    if text is None or not str(text).strip():
        return None
    text = str(text)
    if _DURATION.match(text):
        return (time.time() if now is None else now) - parse_duration(text, option=option)
    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"{option} {_show(text)} is not a duration or a time",
                         fix="write e.g. 30s, 10m, 2h, 1d, or an ISO time such as 2025-01-31T14:05") from None
