"""Who is slow, from every rank's enter time into each collective (pure: plain data in, dataclasses out).

Input: per rank, the collectives it entered (:class:`Call`: process group,
sequence number, enter time, exit time where known). A collective is one
``(group, seq)`` seen by every rank of its group; ranks that dumped too early
to hold it are left out of that collective.

- **lateness** of a rank in a collective = its enter time minus the earliest
  enter of that collective. Ranks on one node share a clock. Across nodes,
  the clocks differ by their offset (NTP: usually well under a few ms): when
  the exits are known (the wrapper's ``end_ns``), every rank leaves a
  blocking collective at about the same moment, so each node's median exit
  offset is taken off its enter times; otherwise the report says the
  lateness across nodes includes the clocks' offset.
- **step time** per rank: given (``rs.step`` spans), else the period of the
  collective that recurs most (one call site, or one op and size for the
  Flight Recorder): the median time between two of its enters.
- **verdict**: a rank is named a straggler when, over at least
  ``min_collectives`` collectives (those that recur: one per step, not the
  set-up's broadcasts and barriers), it is late by at least ``threshold`` of
  the step time in at least ``min_share`` of them. One long lateness (a
  checkpoint, a GC pause) is a one-off, reported and not named. Ranks that
  take turns being last (noise) are not named. Fewer collectives than
  ``min_collectives`` is "unread": not enough data to judge (exit 2).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from typing import Any, Iterable, Literal, Mapping

THRESHOLD = 0.10
"""Lateness, as a share of the step time, that counts as late in one collective."""
MIN_COLLECTIVES = 10
"""Fewest complete collectives (every rank entered) needed to judge."""
MIN_SHARE = 0.6
"""Share of the collectives in which a rank must be late to be named (consistency)."""
ONE_OFF_STEPS = 5.0
"""A lateness of this many step times, in a rank that is not consistently late, is reported as a one-off pause."""


@dataclasses.dataclass
class Call:
    """One rank's entry into one collective."""

    group: str
    seq: int
    enter_ns: int
    exit_ns: int | None = None
    op: str | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    site: Any = None
    """What recurs once per step: the call site (file, line, op), or (op, sizes) for Flight Recorder entries."""


@dataclasses.dataclass
class RankTiming:
    """One rank over the window."""

    rank: int
    collectives: int
    median_lateness_s: float
    max_lateness_s: float
    late_share: float
    """Share of its collectives in which it was late by at least ``threshold`` of the step."""
    last_share: float
    """Share of its collectives that it entered last."""
    share_of_step: float | None
    """Median lateness / step time."""
    step_s: float | None
    step_source: str | None
    """``rs.step`` | ``collective period`` | None"""
    median_inside_s: float | None = None
    """Median time between entering and leaving a collective (wrapper exits only): the time it waited."""
    node: str | None = None
    pid: int | None = None


@dataclasses.dataclass
class OneOff:
    """A single long lateness of a rank that is otherwise on time (a checkpoint, a GC pause)."""

    rank: int
    group: str
    seq: int
    lateness_s: float
    at: float
    """Unix time of the late enter."""


@dataclasses.dataclass
class Straggler:
    """A rank that enters last, consistently, and what it costs its peers."""

    rank: int
    median_lateness_s: float
    share_of_step: float
    late_share: float
    collectives: int
    cost_s: float
    """Median time its peers wait for it per collective."""
    cost_share: float
    """That time as a share of the step."""
    wait_site: str | None = None
    """Where its peers wait: the collective they wait in (op file:line)."""
    phase: Any = None
    """The slow phase (a :class:`raysleuth.stragglers.phase.SlowPhase`), once sampled."""
    node: str | None = None
    pid: int | None = None


StragglerState = Literal["straggler", "even", "unread"]
"""``straggler`` (exit 1), ``even`` (exit 0), ``unread`` (not enough data: exit 2)."""


@dataclasses.dataclass
class StragglerReport:
    """Who is slow, by how much, what it costs, and (once sampled) where."""

    state: StragglerState
    """``straggler`` (exit 1) | ``even`` (exit 0) | ``unread`` (not enough data: exit 2)"""
    summary: str
    ranks: list[RankTiming]
    stragglers: list[Straggler]
    collectives: int
    threshold: float
    min_collectives: int
    min_share: float
    step_s: float | None = None
    window_s: float | None = None
    source: str | None = None
    """Where the enter times came from: ``wrapper`` (collective wrapper) | ``flight recorder``."""
    one_offs: list[OneOff] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)
    """What is missing to judge, and how to get it (state ``unread``)."""
    run: str | None = None
    job_id: str | None = None
    live: bool = False
    sampling: dict[str, Any] | None = None
    next_command: str | None = None

    @property
    def exit_code(self) -> int:
        return {"straggler": 1, "even": 0}.get(self.state, 2)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["exit_code"] = self.exit_code
        return data


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def complete_collectives(calls_by_rank: Mapping[int, Iterable[Call]], since_ns: int | None = None
                         ) -> dict[tuple[str, int], dict[int, Call]]:
    """``(group, seq) -> {rank: call}`` for the collectives every rank of the group entered (in the window)."""
    table: dict[tuple[str, int], dict[int, Call]] = defaultdict(dict)
    members: dict[str, set[int]] = defaultdict(set)
    for rank, calls in calls_by_rank.items():
        for call in calls:
            table[(call.group, call.seq)][rank] = call
            members[call.group].add(rank)
    complete = {}
    for key, entries in table.items():
        if len(entries) < 2 or set(entries) != members[key[0]]:
            continue
        if since_ns is not None and min(c.enter_ns for c in entries.values()) < since_ns:
            continue
        complete[key] = entries
    return complete


def recurring(collectives: Mapping[tuple[str, int], Mapping[int, Call]], times: int = 3
              ) -> dict[tuple[str, int], Mapping[int, Call]]:
    """Only the collectives whose site recurs like a step's (``times`` or more, and at least half as often as
    the most frequent site), not the set-up's.

    DDP's construction (parameter broadcast, shape checks) and a framework's
    barriers run once; counting them would dilute a straggler that is late
    in every step. Without sites (or nothing recurring), all are kept.
    """
    counts: dict[Any, int] = defaultdict(int)
    site_of = {}
    for key, entries in collectives.items():
        call = entries[min(entries)]
        site_of[key] = call.site if call.site is not None else (call.group, call.op)
        counts[site_of[key]] += 1
    floor = max(times, max(counts.values(), default=0) / 2)
    kept = {key: entries for key, entries in collectives.items() if counts[site_of[key]] >= floor}
    return kept or dict(collectives)


def node_offsets(collectives: Mapping[Any, Mapping[int, Call]], nodes: Mapping[int, str | None]) -> dict[str, int] | None:
    """Per node, the median offset of its clock (ns) from the exits of blocking collectives; None without exits."""
    diffs: dict[str, list[int]] = defaultdict(list)
    for entries in collectives.values():
        exits = {rank: call.exit_ns for rank, call in entries.items() if call.exit_ns}
        if len(exits) != len(entries):
            continue
        middle = statistics.median(exits.values())
        for rank, value in exits.items():
            diffs[nodes.get(rank) or "?"].append(int(value - middle))
    if not diffs:
        return None
    offsets = {node: int(statistics.median(values)) for node, values in diffs.items()}
    base = min(offsets.values())
    return {node: value - base for node, value in offsets.items()}


def step_period(calls: Iterable[Call]) -> float | None:
    """Seconds between two enters of the collective that recurs most (one per step), None if none recurs."""
    by_site: dict[Any, list[int]] = defaultdict(list)
    for call in calls:
        by_site[call.site if call.site is not None else (call.group, call.op)].append(call.enter_ns)
    enters = max(by_site.values(), key=len, default=[])
    if len(enters) < 3:
        return None
    enters.sort()
    return statistics.median(b - a for a, b in zip(enters, enters[1:])) / 1e9


def _lateness(collectives: Mapping[Any, Mapping[int, Call]], offsets: Mapping[str, int] | None,
              nodes: Mapping[int, str | None]) -> dict[Any, dict[int, int]]:
    """Per collective, each rank's lateness (ns) after the node clock offsets are taken off."""
    result = {}
    for key, entries in collectives.items():
        enters = {rank: call.enter_ns - ((offsets or {}).get(nodes.get(rank) or "?", 0)) for rank, call in entries.items()}
        first = min(enters.values())
        result[key] = {rank: value - first for rank, value in enters.items()}
    return result


def _steps(calls_by_rank: Mapping[int, Iterable[Call]], step_seconds: Mapping[int, float] | None
           ) -> tuple[dict[int, float | None], dict[int, str | None], float | None]:
    steps: dict[int, float | None] = {}
    sources: dict[int, str | None] = {}
    for rank, calls in calls_by_rank.items():
        given = (step_seconds or {}).get(rank)
        if given:
            steps[rank], sources[rank] = float(given), "rs.step"
        else:
            period = step_period(calls)
            steps[rank], sources[rank] = period, "collective period" if period else None
    return steps, sources, _median(v for v in steps.values() if v)


def _rank_timings(late: Mapping[Any, Mapping[int, int]], collectives, step: float | None, threshold: float,
                  nodes: Mapping[int, str | None], pids: Mapping[int, int], steps, sources) -> list[RankTiming]:
    per_rank: dict[int, list[int]] = defaultdict(list)
    last_count: dict[int, int] = defaultdict(int)
    inside: dict[int, list[int]] = defaultdict(list)
    for key, values in late.items():
        for rank, value in values.items():
            per_rank[rank].append(value)
            call = collectives[key][rank]
            if call.exit_ns:
                inside[rank].append(call.exit_ns - call.enter_ns)
        if len(values) > 1:
            ordered = sorted(values.values())
            if ordered[-1] > ordered[-2]:  # a tie has no last
                last_count[max(values, key=lambda r: values[r])] += 1
    cut = threshold * step * 1e9 if step else None
    timings = []
    for rank in sorted(per_rank):
        lateness = per_rank[rank]
        median = statistics.median(lateness) / 1e9
        late_share = sum(1 for v in lateness if v >= cut) / len(lateness) if cut else 0.0
        timings.append(RankTiming(
            rank=rank, collectives=len(lateness), median_lateness_s=median, max_lateness_s=max(lateness) / 1e9,
            late_share=late_share, last_share=last_count[rank] / len(lateness),
            share_of_step=median / step if step else None, step_s=steps.get(rank), step_source=sources.get(rank),
            median_inside_s=(statistics.median(inside[rank]) / 1e9) if inside[rank] else None,
            node=nodes.get(rank), pid=pids.get(rank)))
    return timings


def _cost(rank: int, late: Mapping[Any, Mapping[int, int]]) -> float:
    """Median over collectives of the mean time the other ranks waited for ``rank`` (s)."""
    waits = []
    for values in late.values():
        if rank not in values or len(values) < 2:
            continue
        others = [values[rank] - v for r, v in values.items() if r != rank]
        waits.append(max(0.0, sum(others) / len(others)))
    return (statistics.median(waits) / 1e9) if waits else 0.0


def _wait_site(rank: int, collectives: Mapping[Any, Mapping[int, Call]]) -> str | None:
    """The collective the peers of ``rank`` wait in most: ``op file:line`` (or op and group)."""
    counts: dict[str, int] = defaultdict(int)
    for entries in collectives.values():
        for other, call in entries.items():
            if other != rank:
                where = f" {call.file.rsplit('/', 1)[-1]}:{call.line}" if call.file else f" (group {call.group})"
                counts[f"{call.op or 'collective'}{where}"] += 1
    return max(counts, key=lambda site: counts[site]) if counts else None


def find_stragglers(calls_by_rank: Mapping[int, Iterable[Call]], *, threshold: float = THRESHOLD,
                    min_collectives: int = MIN_COLLECTIVES, min_share: float = MIN_SHARE,
                    since_ns: int | None = None, nodes: Mapping[int, str | None] | None = None,
                    pids: Mapping[int, int] | None = None, step_seconds: Mapping[int, float] | None = None,
                    source: str | None = None) -> StragglerReport:
    """Name the ranks that enter collectives late, consistently (see the module's doc for the rule).

    ``calls_by_rank``: rank -> its :class:`Call` list (any source). ``since_ns``:
    only collectives whose first enter is at or after it (the window).
    ``nodes``: rank -> node (clock domain); ``step_seconds``: rank -> step time
    from ``rs.step`` spans, where the job has them.
    """
    calls_by_rank = {rank: list(calls) for rank, calls in calls_by_rank.items()}
    nodes, pids = dict(nodes or {}), dict(pids or {})
    collectives = recurring(complete_collectives(calls_by_rank, since_ns))
    report = StragglerReport(state="unread", summary="", ranks=[], stragglers=[], collectives=len(collectives),
                             threshold=threshold, min_collectives=min_collectives, min_share=min_share, source=source)
    if len(collectives) < min_collectives:
        report.summary = (f"not enough to judge: {len(collectives)} collective(s) entered by every rank "
                          f"in the window, {min_collectives} needed")
        return report
    offsets = _clock_offsets(report, collectives, nodes)
    late = _lateness(collectives, offsets, nodes)
    steps, sources, step = _steps(calls_by_rank, step_seconds)
    report.step_s = step
    report.ranks = _rank_timings(late, collectives, step, threshold, nodes, pids, steps, sources)
    if not step:
        report.summary = "no step time: no rs.step spans and no collective recurs; cannot tell late from normal"
        return report
    for timing in report.ranks:
        if timing.collectives >= min_collectives and timing.late_share >= min_share:
            cost = _cost(timing.rank, late)
            report.stragglers.append(Straggler(
                rank=timing.rank, median_lateness_s=timing.median_lateness_s, share_of_step=timing.share_of_step or 0.0,
                late_share=timing.late_share, collectives=timing.collectives, cost_s=cost, cost_share=cost / step,
                wait_site=_wait_site(timing.rank, collectives), node=timing.node, pid=timing.pid))
        elif timing.max_lateness_s >= ONE_OFF_STEPS * step:
            key, value = max(((k, v[timing.rank]) for k, v in late.items() if timing.rank in v), key=lambda kv: kv[1])
            report.one_offs.append(OneOff(rank=timing.rank, group=key[0], seq=key[1], lateness_s=value / 1e9,
                                          at=collectives[key][timing.rank].enter_ns / 1e9))
    _summarise(report)
    return report


def _clock_offsets(report: StragglerReport, collectives, nodes: Mapping[int, str | None]) -> dict[str, int] | None:
    known = {nodes.get(rank) or "?" for entries in collectives.values() for rank in entries}
    if len(known) <= 1:
        return None
    offsets = node_offsets(collectives, nodes)
    if offsets is None:
        report.notes.append(f"ranks on {len(known)} nodes and no collective exit times: lateness across nodes "
                            "includes the offset between their clocks (NTP: usually a few ms)")
    else:
        report.notes.append(f"ranks on {len(known)} nodes: each node's clock offset, from the moments ranks leave "
                            "the same collective, is taken off its enter times")
    return offsets


def _summarise(report: StragglerReport) -> None:
    step_ms = (report.step_s or 0.0) * 1000  # called once a step time is known
    if report.stragglers:
        parts = [f"rank {s.rank} enters {s.late_share:.0%} of {s.collectives} collectives late, by "
                 f"{s.median_lateness_s * 1000:.0f} ms median ({s.share_of_step:.0%} of a {step_ms:.0f} ms step); "
                 f"its peers wait {s.cost_s * 1000:.0f} ms per collective for it ({s.cost_share:.0%} of the step)"
                 for s in report.stragglers]
        report.state, report.summary = "straggler", "; ".join(parts)
        return
    worst = max(report.ranks, key=lambda t: t.median_lateness_s)
    report.state = "even"
    report.summary = (f"no straggler over {report.collectives} collectives: the latest rank ({worst.rank}) is "
                      f"{worst.median_lateness_s * 1000:.1f} ms late median ({(worst.share_of_step or 0):.0%} of a "
                      f"{step_ms:.0f} ms step; threshold {report.threshold:.0%} in {report.min_share:.0%} of them)")
    for one in report.one_offs:
        report.notes.append(f"rank {one.rank} was {one.lateness_s:.1f} s late once (collective {one.seq} of group "
                            f"{one.group}): a one-off pause (checkpoint, GC, ...), not a straggler")
