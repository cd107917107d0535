"""The evidence a sink of the waits gives: root-cause candidates, strongest first.

Pure logic, used by :mod:`raysleuth.stacks.verdict` (which documents the
order of strength).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth.stacks.analysis import frames_that_matter, headline, is_library, key_thread, user_frame
from raysleuth.stacks.graph import WaitGraph, coroutine_where, node_key
from raysleuth.stacks.model import Culprit, ProcessStack

__all__ = ["Candidate", "collective_candidates", "extra_candidates", "make_culprit", "sink_candidate"]

_ABORTED = ("SIGABRT", "Aborted", "signal 6", "gloo", "NCCL", "ProcessGroup")
"""A death whose cause says the collective library aborted the process: a consequence, not a cause."""
_PEER_LOST = ("Connection closed by peer", "Connection reset", "remote process exited", "Broken pipe",
              "NCCL communicator was aborted", "Timed out waiting")
"""A call's error that says the collective lost a peer: the rank left because of another."""


def make_culprit(process: ProcessStack, reason: str, rule: str, evidence: str | None = None) -> Culprit:
    """A culprit for ``process``, pointing at its innermost user frame, named by ``rule``."""
    thread = key_thread(process)
    mine = None
    if thread is not None:
        frames = frames_that_matter(thread)
        mine, _ = user_frame(frames)
        mine = mine or (frames[0] if frames else None)
    return Culprit(pid=process.pid, node_ip=process.node_ip, rank=process.rank, reason=reason,
                   actor_class=process.actor_class, actor_name=process.actor_name,
                   function=mine.function if mine else None, file=mine.file if mine else None,
                   line=mine.line if mine else None, rule=rule, rank_source=process.rank_source,
                   evidence=evidence)


def _in_user_code(process: ProcessStack | None) -> bool:
    thread = key_thread(process) if process is not None else None
    return thread is not None and any(not is_library(frame) for frame in frames_that_matter(thread))


# ------------------------------------------------------------------- candidates

@dataclasses.dataclass
class Candidate:
    strength: int
    """0 strongest (collective positions, extra rules) ... 5 weakest (left a collective)."""
    key: str
    culprit: Culprit


def collective_candidates(processes: list[ProcessStack], context: Any) -> list[Candidate]:
    """The matcher's ranks that broke the sequence: only of the job being looked at (a sampled process
    or a dead actor of its job); the store keeps the dumps of earlier jobs."""
    found = []
    jobs = {p.job_id for p in processes if p.job_id}
    for item in context.collective_positions or []:
        pid, node_ip = item.get("pid"), item.get("node_ip")
        process = next((p for p in processes if p.pid == pid and (node_ip is None or p.node_ip in (None, node_ip))),
                       None)
        dead = next((d for d in context.dead if d.get("pid") == pid and d.get("job_id") in jobs), None)
        if process is None and dead is None:
            continue
        culprit = Culprit(
            pid=pid or 0, node_ip=node_ip or (process.node_ip if process else None), rank=item.get("rank"),
            reason=str(item.get("reason") or "broke the collective sequence"),
            actor_class=process.actor_class if process else None, actor_name=process.actor_name if process else None,
            function=item.get("function"), file=item.get("file"), line=item.get("line"), rule="collective positions",
            rank_source=(process.rank_source if process and process.rank_source else "collectives"),
            evidence=item.get("kind"))
        found.append(Candidate(0, node_key(process) if process else f"dead:{node_ip}:{pid}", culprit))
    return found


def sink_candidate(graph: WaitGraph, key: str, context: Any) -> Candidate | None:
    """What a sink of the waits is, as evidence (None: it explains nothing, or it makes progress)."""
    node = graph.nodes[key]
    into = graph.into(key)
    how = "; ".join(sorted({edge.evidence for edge in into})[:2])
    if node.state == "coroutine":
        if node.process is None or not graph.into(node_key(node.process)):
            return None  # nobody waits for this actor: a coroutine idle on its queue is just idle
        item = node.detail
        reason = (f"coroutine {item.get('task')} has awaited {item.get('awaits') or '?'} at {coroutine_where(item)} "
                  f"for {float(item.get('waited_s') or 0):.0f}s while its event loop is idle")
        culprit = make_culprit(node.process, reason, "coroutine", evidence=how) if node.process else None
        if culprit is not None:
            frames = [f for f in item.get("frames") or [] if "/asyncio/" not in (f.get("file") or "")]
            if frames:
                culprit.function, culprit.file, culprit.line = (frames[-1].get("function"), frames[-1].get("file"),
                                                                frames[-1].get("line"))
            return Candidate(1, key, culprit)
        return None
    if node.state == "dead":
        return _dead_candidate(key, node.detail, how)
    if node.state == "pending":
        return Candidate(2, key, Culprit(pid=0, node_ip=None, rank=None, rule="wait-for chain",
                                          reason=f"{node.label} waits to be scheduled", evidence=how))
    process = node.process
    if process is None or process.activity in (None, "working"):
        return None
    kinds = {edge.kind for edge in into}
    if not into and not node.detail.get("not returned") and process.role != "driver":
        return None  # nobody waits for it: not what a hang waits on
    differ = [edge for edge in into if edge.evidence.endswith("the ops differ")]
    if differ and process.activity == "waiting":
        return Candidate(2, key, make_culprit(process, f"{headline(process)}: {differ[0].evidence}", "peers",
                                              evidence=differ[0].evidence))
    if node.detail.get("not returned"):
        evidence = node.detail["not returned"]
        return Candidate(2, key, make_culprit(process, f"{evidence}: {headline(process)}", "call not returned",
                                               evidence=evidence))
    waited_by_peers = bool(kinds & {"collective", "peers"})
    if process.activity == "blocked" and (waited_by_peers or _in_user_code(process)):
        # Peers that wait for it are evidence enough; a caller's ray.get alone is not when it is blocked in a
        # library (it may wait on something unseen), only when it is blocked in the user's code.
        rule = "peers" if waited_by_peers else "wait-for chain"
        left = [n.process for n in graph.nodes.values() if n.process is not None and n.process is not process
                and n.process.group is not None and n.process.group == process.group]
        if rule == "wait-for chain" and left and all(p.activity == "returned" for p in left):
            rule = "peers"  # the same call to its peers returned: it stands apart from its group
            how = f"{len(left)} of {len(left) + 1} {process.actor_class or 'peer'} peers have returned; {how}"
        return Candidate(2, key, make_culprit(process, f"{headline(process)}; {how}" if how else headline(process),
                                               rule, evidence=how))
    measured = not any(signal.startswith("on CPU") for signal in process.progress)
    if process.activity == "active" and measured and kinds & {"collective", "peers"}:
        signals = ", ".join(process.progress) or "on CPU"
        return Candidate(2, key, make_culprit(
            process, f"busy at the same place without progress ({signals}): {headline(process)}; {how}", "peers",
            evidence=how))
    if process.activity == "returned" and kinds & {"collective", "peers"}:
        return _left_candidate(key, process, how, context)
    return None


def _dead_candidate(key: str, item: dict[str, Any], how: str) -> Candidate | None:
    cause = str(item.get("cause") or "no cause recorded")
    if any(word in cause for word in _ABORTED):
        return None  # the collective library aborted it: a consequence of a broken sequence or another death
    who = f"rank {item['rank']}" if item.get("rank") is not None else f"pid {item.get('pid')}"
    return Candidate(3, key, Culprit(
        pid=item.get("pid") or 0, node_ip=item.get("node_ip"), rank=item.get("rank"),
        reason=f"{who} ({item.get('actor_class')}) died: {cause}; {how}", actor_class=item.get("actor_class"),
        actor_name=item.get("actor_name"), rule="dead peer", rank_source=item.get("rank_source"), evidence=cause))


def _left_candidate(key: str, process: ProcessStack, how: str, context: Any) -> Candidate | None:
    error = context.failed.get((process.node_id, process.pid)) or ""
    if any(text in error for text in _PEER_LOST):
        return None  # its call failed because the collective lost a peer: a consequence
    ended = f"raised {error.splitlines()[0][:160]}" if error else "returned"
    return Candidate(5, key, make_culprit(
        process, f"left the collective: its call ended ({ended}) while its peers still wait; {how}", "peers",
        evidence=how))


def extra_candidates(processes: list[ProcessStack], context: Any, rules: list) -> list[Candidate]:
    found = []
    for rule in rules:
        try:
            culprits = rule(processes, context)
        except Exception as error:  # an extra rule must never cost the verdict
            context.errors.append(f"rule {getattr(rule, '__name__', rule)} failed: {type(error).__name__}: {error}")
            continue
        for culprit in culprits:
            process = next((p for p in processes if p.pid == culprit.pid and p.node_ip == culprit.node_ip), None)
            found.append(Candidate(0, node_key(process) if process else f"{culprit.node_ip}:{culprit.pid}", culprit))
    return found


