"""Aggregation without hiding: pure functions over log lines from many ranks.

Ray's log dedup prints ``(repeated 63x across cluster)`` and hides exactly
the rank that differs. Here records with the same *template* (the message
with its numbers masked) at the same step collapse into one line that lists
the ranks (``[ranks 0-5,7] loss=0.25``); a rank whose values differ from
the majority gets a line of its own, marked ``differs``.

Everything here takes :class:`LogLine` items (or store records) and is used by
both :class:`raysleuth.logs.DistributedLogger` and ``raysleuth logs
--aggregate``. No I/O.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from raysleuth import evidence

__all__ = [
    "AggregatedLine",
    "LogLine",
    "aggregate",
    "format_ranks",
    "split_template",
]

#: Numbers (ints, floats, scientific), nan and inf: the parts of a message that vary.
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.])|\b(?:nan|inf|NaN|Inf)\b")
PLACEHOLDER = "<n>"


def split_template(message: str) -> tuple[str, tuple[str, ...]]:
    """Split ``message`` into a template (numbers masked as ``<n>``) and the numbers.

    >>> split_template("step 3 loss=0.25")
    ('step <n> loss=<n>', ('3', '0.25'))
    """
    values = tuple(match.group(0) for match in _NUMBER.finditer(message))
    return _NUMBER.sub(PLACEHOLDER, message), values


def format_ranks(ranks: Iterable[int]) -> str:
    """Compact rank list: ``[0, 1, 2, 3, 5]`` -> ``"0-3,5"``."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = previous = None
    for rank in ordered:
        if start is None:
            start = previous = rank
        elif previous is not None and rank == previous + 1:
            previous = rank
        else:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
            start = previous = rank
    if start is not None:
        parts.append(str(start) if start == previous else f"{start}-{previous}")
    return ",".join(parts)


@dataclasses.dataclass
class LogLine:
    """One shipped log line, with everything known about who wrote it: what ``raysleuth logs`` prints and
    what aggregation groups (the one log-line type)."""

    id: int | None = None
    time: float = 0.0
    level: str | None = "INFO"
    name: str | None = None
    message: str = ""
    rank: int | None = None
    world_size: int | None = None
    step: int | None = None
    phase: str | None = None
    node_ip: str | None = None
    node_id: str | None = None
    hostname: str | None = None
    pid: int | None = None
    actor_id: str | None = None
    actor_name: str | None = None
    actor_class: str | None = None
    module: str | None = None
    job_id: str | None = None
    lineno: int | None = None
    funcName: str | None = None  # noqa: N815 (the LogRecord field's name)
    exc_text: str | None = None
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_record(cls, record: Any) -> "LogLine":
        """From a store :class:`~raysleuth.recorder.Record` of kind ``log`` (read as :class:`evidence.Log`)."""
        log = evidence.Log.from_record(record)
        row = log.row
        return cls(
            id=row.id, time=row.time, level=row.level, name=row.name, message=log.message, rank=row.rank,
            world_size=row.world_size, step=row.step, phase=row.phase, node_ip=row.node_ip, node_id=row.node_id,
            hostname=row.hostname, pid=row.pid, actor_id=row.actor_id, actor_name=row.actor_name,
            actor_class=row.actor_class, module=log.module, lineno=log.lineno, funcName=log.funcName,
            exc_text=log.exc_text, fields=log.fields, job_id=row.job_id,
        )

    @property
    def label(self) -> str:
        """``rank 3`` or ``pid 123@10.0.0.2``."""
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}@{self.node_ip or self.hostname}"

    @property
    def source(self) -> str | None:
        """Who wrote it when the rank is unknown (``pid 123@host``); None when the rank is known."""
        if self.rank is not None:
            return None
        return self.label if self.pid else "unknown"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class AggregatedLine:
    """Records of one template (at one step) from a set of ranks that agree on its values."""

    message: str
    """A representative message (the first one written by these ranks)."""
    template: str
    level: str
    name: str | None
    step: int | None
    ranks: list[int]
    sources: list[str]
    """Writers without a rank (``pid 123@host``)."""
    count: int
    """Records folded into this line."""
    first_time: float
    last_time: float
    differs: bool = False
    """True when these ranks' values differ from the majority's for the same template."""
    group_size: int = 0
    """How many writers logged this template at this step (all lines of the group)."""

    @property
    def label(self) -> str:
        """``ranks 0-5,7``, ``rank 6``, or the writers without a rank."""
        parts = []
        if self.ranks:
            parts.append(("rank " if len(self.ranks) == 1 else "ranks ") + format_ranks(self.ranks))
        parts.extend(self.sources)
        return "; ".join(parts) or "?"

    def text(self) -> str:
        """The line as shown: ``[ranks 0-5,7] loss=0.25`` (``  <- differs`` for outliers)."""
        return f"[{self.label}] {self.message}" + ("  <- differs" if self.differs else "")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, with ``label`` and ``text``."""
        result = dataclasses.asdict(self)
        result["label"] = self.label
        result["text"] = self.text()
        return result


def _writer(item: LogLine) -> int | str:
    return item.rank if item.rank is not None else (item.source or "unknown")


def aggregate(items: Iterable[LogLine | Any], *, by_step: bool = True) -> list[AggregatedLine]:
    """Collapse repeated records from many ranks, keeping every difference visible.

    Records group by (template, level, logger name, step when ``by_step``).
    Inside a group, each writer's numbers are compared: the value set held by
    most writers becomes one line listing them; every other value set gets
    its own line with ``differs=True``. Numbers that equal the writer's own
    rank (``"rank 3 ready"``) are not counted as differences. Lines come
    out in the order their group first appeared.
    """
    groups: dict[tuple, list[tuple[LogLine, tuple[str, ...]]]] = {}
    for raw in items:
        item = raw if isinstance(raw, LogLine) else LogLine.from_record(raw)
        template, values = split_template(item.message)
        key = (template, item.level or "INFO", item.name, item.step if by_step else None)
        groups.setdefault(key, []).append((item, values))
    lines: list[AggregatedLine] = []
    ordered_groups = sorted(groups.items(), key=lambda entry: min(item.time for item, _ in entry[1]))
    for (template, level, name, step), members in ordered_groups:
        # Positions where each value equals the writer's rank are rank labels, not data.
        width = max(len(values) for _, values in members)
        rank_positions = set()
        ranked = [(item, values) for item, values in members if item.rank is not None]
        if ranked and len({item.rank for item, _ in ranked}) > 1:
            for position in range(width):
                if all(position < len(values) and _same_number(values[position], item.rank)
                       for item, values in ranked):
                    rank_positions.add(position)
        by_signature: dict[tuple, list[tuple[LogLine, tuple[str, ...]]]] = {}
        for item, values in members:
            signature = tuple(v for i, v in enumerate(values) if i not in rank_positions)
            by_signature.setdefault(signature, []).append((item, values))
        writers_per_signature = {sig: {_writer(i) for i, _ in group} for sig, group in by_signature.items()}
        group_size = len({_writer(item) for item, _ in members})
        majority = max(by_signature, key=lambda sig: (len(writers_per_signature[sig]),
                                                       -min(i.time for i, _ in by_signature[sig])))
        ordered = sorted(by_signature, key=lambda sig: (sig != majority, min(i.time for i, _ in by_signature[sig])))
        for signature in ordered:
            group = by_signature[signature]
            first = min(group, key=lambda pair: pair[0].time)[0]
            ranks = sorted({item.rank for item, _ in group if item.rank is not None})
            sources = sorted({item.source or "unknown" for item, _ in group if item.rank is None})
            message = first.message
            if rank_positions and len(ranks) > 1:
                message = _mask_positions(first.message, rank_positions, "{rank}")
            lines.append(AggregatedLine(
                message=message,
                template=template,
                level=level,
                name=name,
                step=step,
                ranks=ranks,
                sources=sources,
                count=len(group),
                first_time=first.time,
                last_time=max(item.time for item, _ in group),
                differs=signature != majority,
                group_size=group_size,
            ))
    return lines


def _same_number(text: str, rank: int | None) -> bool:
    try:
        return rank is not None and float(text) == float(rank)
    except ValueError:
        return False


def _mask_positions(message: str, positions: set[int], replacement: str) -> str:
    counter = iter(range(1_000_000))

    def substitute(match: re.Match) -> str:
        return replacement if next(counter) in positions else match.group(0)

    return _NUMBER.sub(substitute, message)
