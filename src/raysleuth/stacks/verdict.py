"""One verdict: the root cause with its consequences, or a plain "cannot tell".

Pure logic on plain data (processes already read, tasks, dead actors,
recorded calls, collective positions, coroutines); unit tested without Ray.

1. **Progress is measured** (:mod:`raysleuth.stacks.progress`): each
   process is ``working``, ``active``, ``waiting``, ``blocked`` or
   ``returned``, with the signals that decided it.
2. **One wait-for graph** (:mod:`raysleuth.stacks.graph`): Ray calls and
   calls queued behind a busy actor, collectives by peer group
   (:mod:`raysleuth.stacks.peers`), coroutines, unreturned calls, dead peers.
3. **One root cause with its consequences**: a cycle is a ``deadlock`` and
   names every member. Otherwise the root cause is the strongest evidence
   the waits lead to, in this order:

   - ``collective positions``: the rank whose collective sequence differs
     (skipped, other op, behind), from the ranks' own records;
   - ``coroutine``: a coroutine that has awaited one point for long while
     its loop is idle;
   - ``peers`` / ``wait-for chain``: the sink its peers' collective or a
     caller's ``ray.get`` leads to, blocked in the user's code, spinning at
     one line without progress while its peers wait in the collective, or
     a call still waiting for resources;
   - ``dead peer``: a rank whose process died, unless the collective
     library aborted it (then it is a consequence: a peer broke the sequence);
   - ``call not returned``: a verl / pool call that did not return while the
     same call to its peers did;
   - a rank that left a collective its peers still wait in (its call ended),
     unless its call failed because the collective lost a peer.

   Several root causes are named only when they are of the same strength
   and none waits for another. Every other stuck process is listed as a
   consequence, with the edge that ties it to the root cause.
4. **Honest states**: ``culprit`` / ``deadlock`` / ``hung`` exit 1; ``busy``
   (progress seen) and ``ok`` (an idle job) exit 0; ``unsure`` (progress
   not measured) and ``unread`` exit 2. "Nothing fired" is never ``ok``.

Extra rules plug in through :data:`EXTRA_RULES` or ``build_verdict(...,
extra_rules=[...])``: each is ``rule(processes, context) -> list[Culprit]``,
taken as evidence as strong as collective positions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from raysleuth.cluster.records import RayTask
from raysleuth.options import format_ranks
from raysleuth.stacks.analysis import awaits_off_main_thread, headline, signature, wait_chains
from raysleuth.stacks.causes import Candidate, collective_candidates, extra_candidates, make_culprit, sink_candidate
from raysleuth.stacks.graph import PENDING_SECONDS, WAITING, WaitGraph, build_graph, node_key
from raysleuth.stacks.model import Consequence, Culprit, ProcessStack, StackVerdict, WaitLink
from raysleuth.stacks.peers import assign_groups, peer_groups
from raysleuth.stacks.progress import classify

__all__ = ["EXTRA_RULES", "VerdictContext", "build_verdict", "classify", "make_culprit", "peer_groups"]

NEXT_WHEN_HUNG = ("raysleuth stacks --native (where in C++ each rank waits), then raysleuth logs --level ERROR "
                  "(what happened just before)")
NEXT_WHEN_CULPRIT = "raysleuth stacks --rank {rank} --native, then raysleuth logs --rank {rank}"


@dataclasses.dataclass
class VerdictContext:
    """Clues besides the stacks, as plain data (the capture fills it; tests write it by hand)."""

    tasks: list[RayTask] = dataclasses.field(default_factory=list)
    """Unfinished tasks from the State API (records: ``task_id``, ``parent_task_id``, ``worker_pid``, ``node_id``)."""
    dead: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Dead actors: ``actor_class``, ``actor_name``, ``rank``, ``pid``, ``node_ip``, ``job_id``, ``cause``, ``on_purpose``."""
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Recorded calls per rank: ``kind`` (verl_call/pool_call), ``method``, ``rank``, ``returned``,
    ``submitted`` (time), ``worker_pid``."""
    samples: int = 1
    window: float = 0.0
    """Seconds between the samples."""
    collective_positions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The collective matcher's culprits (``collectives.collective_culprits``), for the collective rule."""
    failed: dict[tuple, str] = dataclasses.field(default_factory=dict)
    """``(node_id, pid) -> error text`` of each process's newest failed call (why a rank left a collective)."""
    chains: list[list[WaitLink]] = dataclasses.field(default_factory=list)
    exited: list[str] = dataclasses.field(default_factory=list)
    """Drivers, actors and tasks that exited between the two samples (left out of ``processes``): what they
    leave waiting is not measured yet, so no root cause is no all-clear."""
    errors: list[str] = dataclasses.field(default_factory=list)
    """Rules that failed (an extra rule must never cost the verdict)."""


Rule = Callable[[list[ProcessStack], VerdictContext], list[Culprit]]
EXTRA_RULES: list[Rule] = []
"""Rules added by other features; their culprits count as strong evidence."""


def _who(processes: list[ProcessStack]) -> str:
    """``rank 3``, ``ranks [0, 2]``, ``ranks 0-6,8-999`` past 8 ranks (a reason stays short at 1,000 ranks)."""
    ranks = sorted(p.rank for p in processes if p.rank is not None)
    if len(ranks) == len(processes):
        if len(ranks) > 8:
            return f"ranks {format_ranks(ranks)}"
        return f"rank{'s' if len(ranks) != 1 else ''} {ranks if len(ranks) != 1 else ranks[0]}"
    pids = [p.pid for p in processes]
    return f"pid{'s' if len(pids) != 1 else ''} {pids if len(pids) <= 8 else f'{pids[:8]} and {len(pids) - 8} more'}"


# ------------------------------------------------------------------- verdict

def build_verdict(processes: list[ProcessStack], tasks: list[RayTask] | None = None, *,
                  context: VerdictContext | None = None, extra_rules: list[Rule] | None = None) -> StackVerdict:
    """Classify, build the wait-for graph, name the root cause and its consequences, or say what is unknown."""
    context = context or VerdictContext()
    if tasks is not None:
        context.tasks = tasks
    assign_groups(processes)
    for process in processes:
        classify(process, context.samples)
    graph = build_graph(processes, context)
    context.chains, _ends = wait_chains(processes, context.tasks)
    verdict = StackVerdict(samples=context.samples, chains=context.chains, edges=list(graph.edges))
    if not processes:
        verdict.state, verdict.summary = "unread", "no processes were read"
        return verdict
    cycles = [cycle for cycle in graph.cycles() if all(graph.nodes[key].state in WAITING for key in cycle)]
    candidates = collective_candidates(processes, context) + extra_candidates(
        processes, context, EXTRA_RULES + list(extra_rules or []))
    sinks = {sink for p in processes if p.activity in WAITING for sink in graph.sinks_from(node_key(p))}
    for sink in sorted(sinks):  # each sink judged once, however many wait for it
        found = sink_candidate(graph, sink, context)
        if found is not None:
            candidates.append(found)
    if cycles:
        _deadlock(verdict, graph, cycles)
    elif candidates:
        _root_causes(verdict, graph, candidates, processes)
    else:
        _without_root_cause(verdict, graph, processes, context)
    verdict.notes = list(context.errors) + verdict.notes + _invisible_coroutines(processes, graph, verdict.state)
    verdict.signals = _signals(processes)
    _consequences(verdict, graph, processes)
    return verdict


def _peer_text(graph: WaitGraph, key: str, processes: list[ProcessStack]) -> str:
    """``2 of 3 DDPRank peers (ranks [0, 2]) wait in all_reduce (torch.distributed)`` for a collective sink."""
    waiters = [process for e in graph.into(key) if e.kind in ("collective", "peers", "dead peer")
               if (process := graph.nodes[e.source].process) is not None]
    if not waiters:
        return ""
    group = waiters[0].group
    size = len([p for p in processes if p.group == group]) + (1 if key.startswith("dead:") else 0)
    where = sorted({w.wait for w in waiters if w.wait})
    if len({signature(w) for w in waiters}) == 1 and not any("(torch." in w for w in where):
        where = [headline(waiters[0]).removeprefix("waiting in ")]  # ray.get inside the user's own collective
    return (f"{len(waiters)} of {size} {waiters[0].actor_class or 'peer'} peers ({_who(waiters)}) wait in "
            f"{', '.join(where) or 'a collective'}")


def _root_causes(verdict: StackVerdict, graph: WaitGraph, candidates: list[Candidate],
                 processes: list[ProcessStack]) -> None:
    best = min(candidate.strength for candidate in candidates)
    roots: dict[str, Candidate] = {}
    for candidate in candidates:
        if candidate.strength == best:
            roots.setdefault(candidate.key, candidate)
    # Of equal evidence, one that waits for another is explained by it: keep the ones nobody else explains.
    independent = [c for c in roots.values() if not any(
        other.key != c.key and other.key in graph.sinks_from(c.key) for other in roots.values())] or list(roots.values())
    for candidate in independent:
        chain = next((c for c in verdict.chains if (c[-1].node_ip, c[-1].pid) == (candidate.culprit.node_ip,
                                                                                   candidate.culprit.pid)), None)
        if chain and candidate.culprit.rule == "wait-for chain":
            route = " → ".join(link.task_name or link.role for link in chain)
            candidate.culprit.reason = f"end of the wait-for chain {route}: {candidate.culprit.reason.split('; ')[0]}"
            candidate.culprit.evidence = route
        peers = _peer_text(graph, candidate.key, processes)
        if peers and candidate.culprit.rule == "peers":
            candidate.culprit.reason = f"{candidate.culprit.reason.split('; ')[0]} while {peers}"
            candidate.culprit.evidence = peers
        verdict.culprits.append(candidate.culprit)
    verdict.state = "culprit"
    who = ", ".join((f"rank {c.rank}" if c.rank is not None else f"pid {c.pid}")
                    + (f" ({c.actor_class})" if c.actor_class else "") + f" [{c.rule}]" for c in verdict.culprits)
    verdict.summary = f"culprit{'s' if len(verdict.culprits) > 1 else ''}: {who}"
    first = verdict.culprits[0]
    verdict.next_command = NEXT_WHEN_CULPRIT.format(rank=first.rank) if first.rank is not None else (
        f"raysleuth stacks --pid {first.pid} --native" if first.pid else "raysleuth tasks --pending")


def _deadlock(verdict: StackVerdict, graph: WaitGraph, cycles: list[list[str]]) -> None:
    verdict.state = "deadlock"
    texts = []
    for cycle in cycles:
        members = set(cycle)
        steps = []
        for key in cycle:
            node = graph.nodes[key]
            edge = next(e for e in graph.out(key) if e.target in members)
            target = graph.nodes[edge.target]
            steps.append(f"{node.label} {edge.evidence} ({edge.kind}, on {target.label})")
            if node.process is not None:
                verdict.culprits.append(make_culprit(node.process, f"in a wait-for cycle: {edge.evidence} "
                                                                   f"({edge.kind}) on {target.label}",
                                                     "deadlock", evidence=edge.kind))
        texts.append("; ".join(steps))
    verdict.summary = (f"deadlock: {len(verdict.culprits)} processes wait for each other in a cycle: "
                       + " | ".join(texts))
    verdict.next_command = "raysleuth tasks --stuck (the calls in the cycle), then fix the order of the calls"


def _without_root_cause(verdict: StackVerdict, graph: WaitGraph, processes: list[ProcessStack],
                        context: VerdictContext) -> None:
    """No root cause: busy (progress seen), ok (an idle job), hung (no progress) or unsure (not measured)."""
    moving = [p for p in processes if p.activity in ("working", "active")]
    stuck = [p for p in processes if p.activity in WAITING and _relevant(graph, p, processes)]
    moving_jobs = {p.job_id for p in moving if p.job_id}
    unexplained = [p for p in stuck if not _explained(graph, p, moving_jobs)]
    if context.exited:
        more = f" (+{len(context.exited) - 4} more)" if len(context.exited) > 4 else ""
        verdict.state = "unsure"
        verdict.summary = (f"unsure: {', '.join(context.exited[:4])}{more} exited during the capture window; "
                           "what that leaves waiting is not measured yet")
        verdict.notes.append("a process exited while it was sampled: run raysleuth stacks again "
                             "(raysleuth crashes says why it ended)")
    elif unexplained and context.samples < 2:
        verdict.state = "unsure"
        verdict.summary = (f"unsure: {len(unexplained)} process(es) look blocked in this one sample and no root "
                           "cause stands out; one sample cannot measure progress")
        verdict.notes.append("one sample: drop --once to measure progress (two samples, counters)")
    elif unexplained:
        verdict.state, verdict.next_command = "hung", NEXT_WHEN_HUNG
        verdict.summary = _hung_summary(unexplained)
    elif moving or stuck:
        working = [p for p in moving if p.role != "driver"] or moving
        by = sorted({signal.split(" ")[0] for p in working for signal in p.progress})
        verdict.state = "busy"
        verdict.summary = (f"busy: {len(working)} process(es) make progress, no culprit"
                           + (f" ({', '.join(by)})" if by else ""))
        if not working:  # what they wait for is a call Ray is still scheduling
            verdict.summary = (f"busy: {len(stuck)} process(es) wait for call(s) Ray is still scheduling "
                               f"(submitted under {PENDING_SECONDS:.0f} s ago; pending longer, a call is what its "
                               "caller waits on)")
        verdict.notes += _slow_ranks(graph)
        if context.samples < 2 and not any("on CPU" not in s for p in working for s in p.progress):
            verdict.state = "unsure"
            verdict.summary = "unsure: processes were on CPU in one sample; progress was not measured"
            verdict.notes.append("one sample: drop --once to measure progress (two samples, counters)")
    else:
        verdict.state = "ok"
        verdict.summary = "ok: an idle job — every process is idle in Ray's task loop and nothing waits"


def _explained(graph: WaitGraph, process: ProcessStack, moving_jobs: set[str]) -> bool:
    """A stuck process is explained when what it waits for makes progress: a sink that works, or only sinks
    that are async actors awaiting something unseen (coroutines invisible, idle loop) in a job where other
    processes make progress. Those may await exactly that progress (Ray Train's controller polls its workers
    every 2 s: between polls no call of it is listed); with nothing of its job moving, it stays unexplained."""
    sinks = graph.sinks_from(node_key(process))
    if any(graph.nodes[sink].state in ("working", "active") for sink in sinks):
        return True
    return bool(sinks) and all(_awaits_unseen(graph.nodes[sink].process, moving_jobs) for sink in sinks)


def _awaits_unseen(process: ProcessStack | None, moving_jobs: set[str]) -> bool:
    return (process is not None and process.role != "driver" and process.coroutines is None
            and process.activity in WAITING and awaits_off_main_thread(process) and process.job_id in moving_jobs)


def _relevant(graph: WaitGraph, process: ProcessStack, processes: list[ProcessStack]) -> bool:
    """A stuck process that matters to a hang: it waits for someone, someone waits for it, it is a driver,
    or every peer of its group is stuck too (a lone actor blocked on a queue nobody feeds is just idle)."""
    key = node_key(process)
    if graph.out(key) or graph.into(key) or process.role == "driver":
        return True
    peers = [p for p in processes if process.group is not None and p.group == process.group]
    return len(peers) >= 2 and all(p.activity in WAITING for p in peers)


def _slow_ranks(graph: WaitGraph) -> list[str]:
    """Ranks their peers wait for in a collective while they work: slow, not hung."""
    notes = []
    for key, node in graph.nodes.items():
        waiting = [e for e in graph.into(key) if e.kind in ("collective", "peers")]
        if node.process is not None and node.state in ("working", "active") and waiting:
            notes.append(f"{node.label} is what {len(waiting)} peer(s) wait for in the collective while it works: "
                         "a slow rank, not a hang; `raysleuth stragglers` measures how slow and where")
    return notes


def _hung_summary(unexplained: list[ProcessStack]) -> str:
    for group, peers in sorted(peer_groups(unexplained).items()):
        if len({p.wait for p in peers}) == 1 and all(p.activity == "waiting" for p in peers):
            cls = peers[0].actor_class or group
            return (f"hung: every rank waits in {peers[0].wait}; no rank stands apart ({cls}, {_who(peers)}); "
                    "nothing they wait for makes progress")
    where = "; ".join(f"{p.label}: {headline(p)}" for p in unexplained[:4])
    more = f" (+{len(unexplained) - 4} more)" if len(unexplained) > 4 else ""
    return f"hung: {len(unexplained)} process(es) make no progress and no root cause was found — {where}{more}"


def _invisible_coroutines(processes: list[ProcessStack], graph: WaitGraph, state: str) -> list[str]:
    """Async actors whose coroutines we could not see, where they may be what is stuck: every one when the
    verdict cannot tell (hung, unsure), else those waited on or waiting."""
    notes = []
    unknown = state in ("hung", "unsure")
    for process in processes:
        waited_on = bool(graph.into(node_key(process)))
        if process.event_loop and process.coroutines is None and process.role != "driver" and (
                unknown or process.activity in WAITING or waited_on):
            notes.append(f"{process.label} is an async actor whose coroutines are invisible from outside: run the "
                         "job under `raysleuth run` (or give Ray the setup hook raysleuth.setup_worker) to list what "
                         "each request awaits; on Python >= 3.14, `python -m asyncio pstree PID` reads them")
    return notes


def _signals(processes: list[ProcessStack]) -> list[str]:
    found: dict[str, int] = {}
    for process in processes:
        for signal in process.progress:
            kind = signal.split(" ")[0]
            found[kind] = found.get(kind, 0) + 1
    waiting = sum(1 for p in processes if p.activity in WAITING)
    signals = [f"{kind}: {count} process(es)" for kind, count in sorted(found.items())]
    if waiting:
        signals.append(f"no progress (same frames, no CPU, no wake-ups, no counter): {waiting} process(es)")
    return signals


def _consequences(verdict: StackVerdict, graph: WaitGraph, processes: list[ProcessStack]) -> None:
    """Every other stuck, dead or departed process, with the edge that ties it to a root cause."""
    if verdict.state not in ("culprit", "deadlock"):
        return
    roots = {(c.node_ip, c.pid) for c in verdict.culprits}
    root_keys = [key for key, node in graph.nodes.items() if node.process is not None
                 and (node.process.node_ip, node.process.pid) in roots]
    root_keys += [key for key in graph.nodes if key.startswith("dead:") and any(
        key == f"dead:{ip}:{pid}" for ip, pid in roots)]
    root_groups = {process.group for key in root_keys if (process := graph.nodes[key].process) is not None}
    for key, node in graph.nodes.items():
        if key in root_keys or node.state in ("working", "active", "coroutine", "pending", None):
            continue
        path = next((graph.path(key, root) for root in root_keys if graph.path(key, root)), [])
        process = node.process
        if path:
            because = path[0].evidence + (f" (then {len(path) - 1} more wait(s) to the root cause)"
                                          if len(path) > 1 else "")
        elif (process is not None and process.group in root_groups) or (
                node.state == "dead" and any(g and g.endswith(str(node.detail.get("actor_class"))) for g in root_groups)):
            because = ("its process died (" + str(node.detail.get("cause") or "?")[:120] + ") in the root cause's group"
                       if node.state == "dead" else f"{node.state} in the root cause's group")
        else:
            continue
        verdict.consequences.append(Consequence(
            who=node.label, state=node.state or "?", because=because, pid=process.pid if process else node.detail.get("pid"),
            node_ip=process.node_ip if process else node.detail.get("node_ip"),
            rank=process.rank if process else node.detail.get("rank")))
