"""Which rank broke the collective sequence: pure logic over per-rank collective positions.

Per process group, ranks are aligned by sequence number (torch's Flight
Recorder ``collective_seq_id`` where it was on, else the wrapper's own count):

- the first sequence number where ranks called different things is a
  *mismatch*; the rank(s) off the majority (or off the job's own repeating
  pattern, when the majority is a tie) are named: ``skipped`` when what they
  called is what the others call next, else ``op``/``shape``/``dtype``;
- without a mismatch, when some rank has stopped (waits in a collective for
  ``pending_after`` seconds, or its collective failed), ranks that never
  entered the newest collective are named: ``dead`` when their process is
  gone, ``stuck`` when their last collective completed (blocked before the
  next one), ``behind`` otherwise; a lone rank waiting in a collective the
  majority never entered is ``ahead``.

A busy, healthy job (ranks dumped at slightly different moments, nothing
waiting long) gives no culprit.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from raysleuth.collectives.model import (
    RULE,
    CollectiveVerdict,
    Finding,
    FindingKind,
    GroupAlignment,
    RankPositions,
    positions_from_records,
)
from raysleuth.options import format_ranks

__all__ = ["PENDING_AFTER", "collective_culprits", "match"]

PENDING_AFTER = 5.0
"""A collective that has not completed this many seconds after it was issued is a wait."""


def match(positions: list[RankPositions], *, dead_ranks: Iterable[int] = (),
          pending_after: float = PENDING_AFTER, last: int = 8, group: str | None = None) -> CollectiveVerdict:
    """Align every process group and name the ranks that broke its sequence."""
    dead = set(dead_ranks) | {p.rank for p in positions if p.alive is False}
    names = sorted({g for p in positions for g in list(p.groups) + list(p.group_info)}, key=_group_order)
    groups = []
    for name in names:
        info = next((p.group_info[name] for p in positions if name in p.group_info), {})
        if group is not None and group not in (name, info.get("desc")):
            continue
        groups.append(_align(name, info, positions, dead, pending_after, last))
    culprits = [f for g in groups for f in g.findings]
    culprits.sort(key=lambda f: _KIND_ORDER.get(f.kind, 9))
    seen: set[int] = set()
    unique = []
    for finding in culprits:  # the strongest finding of each rank
        if finding.rank not in seen:
            seen.add(finding.rank)
            unique.append(finding)
    if unique:
        summary = "; ".join(f.reason for f in unique[:3])
    elif not positions:
        summary = "no collective records (is raysleuth.collectives installed in the workers?)"
    else:
        summary = f"collective sequences agree across {len(positions)} rank(s); no rank waits on another"
    return CollectiveVerdict(groups=groups, culprits=unique, summary=summary)


_KIND_ORDER = {"skipped": 0, "op": 0, "shape": 0, "dtype": 0, "mismatch": 0, "dead": 1, "stuck": 2, "behind": 2,
               "ahead": 3}


def _group_order(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _ranks_text(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0-6,8-999``: ranges, so a reason stays one line at any world size."""
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + format_ranks(ranks)


def _align(name, info, positions, dead, pending_after, last) -> GroupAlignment:
    members = {p.rank: p for p in positions if name in p.groups}
    declared = [r for r in info.get("ranks") or [] if isinstance(r, int)]
    ranks = sorted(set(members) | set(declared))
    lasts = {r: (max(members[r].groups[name]) if r in members and members[r].groups[name] else 0) for r in ranks}
    top = max(lasts.values(), default=0)
    rows = []
    for seq in range(max(1, top - last + 1), top + 1):
        cells = {}
        for rank, item in members.items():
            entry = item.groups[name].get(seq)
            if entry is not None:
                cells[rank] = {"call": entry.describe(), "state": entry.state, "where": entry.where(),
                               "step": entry.step, "call_count": entry.call}
        rows.append({"seq": seq, "ranks": cells})
    label = info.get("desc") if info.get("desc") not in (None, "", "undefined") else f"group {name}"
    findings = _mismatch(name, label, members, dead)
    if not findings:
        findings = _positions(name, label, ranks, members, lasts, dead, pending_after)
    return GroupAlignment(name=name, desc=str(info.get("desc") or ""), ranks=ranks, rows=rows, findings=findings,
                          last=lasts)


def _mismatch(name, label, members, dead) -> list[Finding]:
    """The first sequence number at which ranks called different collectives."""
    tables = [(r, item.groups[name]) for r, item in members.items()]
    seqs = sorted({s for _, table in tables for s in table})
    for seq in seqs:
        here = {r: table[seq] for r, table in tables if seq in table}
        if len(here) < 2:
            continue
        first = next(iter(here.values()))
        if all(entry.op == first.op and entry.inputs == first.inputs for entry in here.values()):
            continue  # the same call everywhere: one signature (compared without building them)
        by_sig: dict[tuple, list[int]] = defaultdict(list)
        for rank, entry in here.items():
            by_sig[entry.signature()].append(rank)
        if len(by_sig) < 2:
            continue
        expected = _expected(name, members, seq, by_sig)
        if expected is None:
            return []  # no majority and no pattern to tell who is right
        majority = sorted(by_sig[expected])
        reference = here[majority[0]]
        upcoming = _expected_next(name, members, majority, seq)
        findings = []
        for signature, ranks in by_sig.items():
            if signature == expected:
                continue
            for rank in sorted(ranks):
                findings.append(_mismatch_finding(name, label, rank, here[rank], reference, majority, upcoming,
                                                  members[rank], dead - set(here)))
        return findings
    return []


def _expected(name, members, seq, by_sig) -> tuple | None:
    """The signature the sequence should have at ``seq``: a strict majority, else the job's repeating pattern."""
    counts = sorted(((len(r), sig) for sig, r in by_sig.items()), key=lambda c: -c[0])
    if counts[0][0] > counts[1][0]:
        return counts[0][1]
    predicted = _predict(_history(name, members, seq), seq)
    return predicted if predicted in by_sig else None


def _history(name, members, before: int) -> dict[int, tuple]:
    """Signatures every rank that has them agrees on, below ``before``."""
    agreed: dict[int, tuple] = {}
    for seq in range(1, before):
        sigs = {item.groups[name][seq].signature() for item in members.values() if seq in item.groups[name]}
        if len(sigs) == 1:
            agreed[seq] = sigs.pop()
    return agreed


def _predict(history: dict[int, tuple], seq: int, longest: int = 16) -> tuple | None:
    """What a job whose collectives repeat with some period calls at ``seq`` (shortest period that fits)."""
    for period in range(1, longest + 1):
        window = [s for s in range(seq - 3 * period, seq) if s in history]
        if len(window) < 2 * period or (seq - period) not in history:
            continue
        if all(history.get(s - period) in (None, history[s]) for s in window if s - period >= 1):
            return history[seq - period]
    return None


def _expected_next(name, members, majority, seq) -> tuple | None:
    following = {members[r].groups[name][seq + 1].signature() for r in majority if seq + 1 in members[r].groups[name]}
    if len(following) == 1:
        return following.pop()
    history = _history(name, {r: members[r] for r in majority}, seq + 1)
    return _predict(history, seq + 1)


def _mismatch_finding(name, label, rank, entry, reference, majority, upcoming, item, dead_peers) -> Finding:
    when = f" {reference.when()}" if reference.when() else ""
    mine = f"rank {rank} called {entry.describe()}"
    where = f" ({entry.where()})" if entry.file else ""
    kind: FindingKind
    if upcoming is not None and entry.signature() == upcoming:
        kind = "skipped"
        others = f"{_ranks_text(majority)} called {reference.describe()} as #{reference.seq} in {label}{when}"
        reason = f"rank {rank} is one collective behind: {others}, {mine} — rank {rank} skipped one{where}"
    else:
        kind = "op" if entry.op != reference.op else (
            "shape" if [s for s, _ in entry.inputs] != [s for s, _ in reference.inputs] else (
                "dtype" if entry.inputs != reference.inputs else "mismatch"))
        words = {"op": "another op", "shape": "another shape", "dtype": "another dtype", "mismatch": "another call"}
        others = f"{_ranks_text(majority)} called {reference.describe()}{when}"
        reason = f"rank {rank} called {words[kind]} as #{entry.seq} in {label}: {others}, {mine}{where}"
    if dead_peers:
        reason += f"; {_ranks_text(dead_peers)} died (gloo aborts a rank on a collective mismatch)"
    return Finding(rank=rank, kind=kind, group=name, seq=entry.seq, reason=reason, file=entry.file, line=entry.line,
                   step=entry.step, pid=item.pid, node_ip=item.node_ip)


def _stopped(item: RankPositions, name: str, pending_after: float) -> bool:
    entry = item.last(name)
    if entry is None:
        return False
    if entry.state == "error":
        return True
    # Pending for as long as its own dump saw it, never until "now": a rank that did not answer this request
    # may have finished that collective long ago (an old dump of a live, healthy rank is not a stuck rank).
    return entry.state == "pending" and entry.created is not None and item.dumped_at - entry.created >= pending_after


def _positions(name, label, ranks, members, lasts, dead, pending_after) -> list[Finding]:
    """Without a mismatch: who keeps the others waiting (dead, stuck before, behind, or alone ahead)."""
    stopped = [r for r in ranks if r in members and r not in dead and _stopped(members[r], name, pending_after)]
    if not stopped:
        return []
    top = max(lasts.values())
    leaders = [r for r in ranks if lasts[r] == top]
    laggards = [r for r in ranks if lasts[r] < top]
    if not laggards:
        return [_dead_finding(name, label, r, members, leaders, top) for r in ranks if r in dead]
    head = members[leaders[0]].groups[name][top]
    waiting = f"{_ranks_text(leaders)} {'waits' if len(leaders) == 1 else 'wait'} in #{top} {head.describe()} in {label}"
    if head.file:
        waiting += f" ({head.where()}"
        waiting += f", step {head.step})" if head.step is not None else f", call {head.call})" if head.call else ")"
    if len(leaders) < len(laggards) and not any(r in dead for r in laggards) \
            and not any(_stopped(members[r], name, pending_after) for r in laggards if r in members):
        return [Finding(rank=r, kind="ahead", group=name, seq=top, file=head.file, line=head.line, step=head.step,
                        pid=members[r].pid, node_ip=members[r].node_ip,
                        reason=f"rank {r} is ahead: it waits alone in #{top} {head.describe()} in {label}, "
                               f"which {_ranks_text(laggards)} never entered") for r in leaders]
    findings = []
    for rank in laggards:
        behind = top - lasts[rank]
        count = "one collective" if behind == 1 else f"{behind} collectives"
        item = members.get(rank)
        mine = item.last(name) if item else None
        if rank in dead:
            findings.append(_dead_finding(name, label, rank, members, leaders, top, waiting))
            continue
        if mine is None:
            reason = f"rank {rank} never entered a collective of {label}: {waiting}"
            findings.append(Finding(rank=rank, kind="stuck", group=name, seq=1, reason=reason))
            continue
        where = f" ({mine.where()})" if mine.file else ""
        kind: FindingKind
        if mine.state == "completed":
            kind = "stuck"
            ahead = f" ({count} behind)" if behind > 1 else ""
            reason = (f"rank {rank} never entered #{lasts[rank] + 1}{ahead}: {waiting}; rank {rank}'s last collective "
                      f"was #{mine.seq} {mine.describe()}{where}, completed — it is stuck before the next one")
        else:
            kind = "behind"
            reason = f"rank {rank} is {count} behind, still in #{mine.seq} {mine.describe()}{where}: {waiting}"
        at = mine if mine.file or kind != "stuck" else head  # light mode: where the collective it never entered is
        findings.append(Finding(rank=rank, kind=kind, group=name, seq=lasts[rank] + 1, reason=reason, file=at.file,
                                line=at.line, step=mine.step, pid=item.pid, node_ip=item.node_ip))
    return findings


def _dead_finding(name, label, rank, members, leaders, top, waiting: str | None = None) -> Finding:
    item = members.get(rank)
    mine = item.last(name) if item else None
    if mine is None:
        reason = f"rank {rank}'s process is dead and left no collective record of {label}"
    else:
        where = f" ({mine.where()})" if mine.file else ""
        reason = f"rank {rank}'s process is dead; its last recorded collective was #{mine.seq} {mine.describe()}{where}"
    if waiting and rank not in leaders:
        reason += f"; {waiting}"
    return Finding(rank=rank, kind="dead", group=name, seq=(mine.seq if mine else None), reason=reason,
                   file=mine.file if mine else None, line=mine.line if mine else None,
                   step=mine.step if mine else None, pid=item.pid if item else None,
                   node_ip=item.node_ip if item else None)


def collective_culprits(records: Iterable[dict[str, Any]], *, alive: set | None = None,
                        dead_ranks: Iterable[int] = (),
                        pending_after: float = PENDING_AFTER, job: str | None = None) -> list[dict[str, Any]]:
    """The stacks verdict's "collective positions" rule: culprit dicts from ``collectives`` records.

    ``records``: store rows as dicts (``Record.to_dict()``). ``alive``: the
    (node_ip, pid) pairs still running (None: unknown). Each culprit: rank,
    reason, rule ("collective positions"), kind, group, seq, file, line, step,
    pid, node_ip.
    """
    positions = positions_from_records(records, alive=alive, job=job)
    verdict = match(positions, dead_ranks=dead_ranks, pending_after=pending_after)
    return [c.to_dict() for c in verdict.culprits]
