"""One verdict from every clue: who is to blame, by which rule, or whether the job is hung or busy.

Pure logic on plain data (processes already read, tasks, dead actors,
recorded calls); unit tested without Ray. Each culprit names its rule:

- ``peers`` — processes of one role (actor class: a Ray Train worker group,
  a verl worker group, DDP actors), groups of 2 included: a peer *blocked*
  elsewhere (idle, its stack not moving) while other peers wait in a
  collective / ``ray.get`` or have returned. A peer that is *working* (on
  CPU, or its stack moved between the samples) is never blamed.
- ``wait-for chain`` — a driver's ``ray.get`` chain that ends in a process
  blocked in the user's code; a chain that ends in ranks that work is
  progress, not a culprit.
- ``dead peer`` — a rank whose process died (not by ``ray.kill``) while its
  live peers wait.
- ``call not returned`` — a rank that has not returned from a verl call or
  a pool call while its peers of the same call returned.
- ``collective positions`` — a rank whose collective sequence differs from
  its peers' (skipped, other op/shape/dtype, behind), from the ranks' own
  collective dumps (:mod:`raysleuth.collectives`).
- extra rules plug in through :data:`EXTRA_RULES` or
  ``build_verdict(..., extra_rules=[...])``: each is
  ``rule(processes, context) -> list[Culprit]`` and sets ``Culprit.rule``.

With two samples, ranks that all wait at the same place in both, none
working, make the job **hung** (exit 1) even when no one stands apart;
ranks that work make it **busy** (exit 0).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from raysleuth.cluster.records import RayTask
from raysleuth.stacks.analysis import (
    frames_that_matter,
    headline,
    in_ray_wait,
    is_library,
    is_ray_idle,
    key_thread,
    signature,
    user_frame,
    wait_chains,
    wait_point,
)
from raysleuth.stacks.model import Culprit, ProcessStack, Verdict, WaitLink

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
    """Dead actors: ``actor_class``, ``rank``, ``pid``, ``node_ip``, ``job_id``, ``cause``, ``on_purpose``."""
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Recorded calls per rank: ``kind`` (verl_call/pool_call), ``method``, ``rank``, ``returned``,
    ``submitted`` (time), ``worker_pid``."""
    samples: int = 1
    collective_positions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The collective matcher's culprits (``collectives.collective_culprits``), for the collective rule."""
    chains: list[list[WaitLink]] = dataclasses.field(default_factory=list)
    """Filled by the wait-for chain rule."""
    errors: list[str] = dataclasses.field(default_factory=list)
    """Rules that failed (an extra rule must never cost the verdict)."""


Rule = Callable[[list[ProcessStack], VerdictContext], list[Culprit]]
EXTRA_RULES: list[Rule] = []
"""Rules added by other features (issue 15: collective positions); run after the built-in ones."""


# ------------------------------------------------------------------- classify

def classify(process: ProcessStack) -> str | None:
    """What a process is doing: working, waiting, blocked, returned (None without a stack).

    Sets ``process.activity`` and ``process.wait`` and returns the activity.
    """
    thread = key_thread(process)
    if thread is None:
        process.activity, process.wait = None, None
        return None
    wait = wait_point(thread)
    if process.moved or not thread.idle:
        activity = "working"
    elif is_ray_idle(thread) and not (process.task_name and process.event_loop):
        activity = "returned"  # (a finished call's task name may lag in the State API)
    elif is_ray_idle(thread):
        activity = "waiting"  # an async actor's call awaits off the main thread
        wait = wait or "an awaited call"
    elif wait is not None:
        activity = "waiting"
    else:
        activity = "blocked"
    process.activity, process.wait = activity, wait if activity == "waiting" else None
    return activity


def peer_groups(processes: list[ProcessStack]) -> dict[str, list[ProcessStack]]:
    """Processes of one role: same actor class (Ray Train workers, a verl group, DDP actors)."""
    groups: dict[str, list[ProcessStack]] = defaultdict(list)
    for process in processes:
        if process.actor_class and process.role == "actor" and process.threads:
            groups[process.actor_class].append(process)
    return {name: peers for name, peers in groups.items() if len(peers) >= 2}


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


def _who(processes: list[ProcessStack]) -> str:
    ranks = sorted(p.rank for p in processes if p.rank is not None)
    if len(ranks) == len(processes):
        return f"rank{'s' if len(ranks) != 1 else ''} {ranks if len(ranks) != 1 else ranks[0]}"
    return f"pid{'s' if len(processes) != 1 else ''} {[p.pid for p in processes]}"


def _common_wait(processes: list[ProcessStack], *, point: bool = False) -> str:
    """Where these processes wait: the shared headline (or, with ``point``, the shared wait point)."""
    waits = sorted({p.wait for p in processes if p.wait})
    if processes and (not point or len(waits) != 1) and len({signature(p) for p in processes}) == 1:
        return headline(processes[0]).removeprefix("waiting in ")
    if len(waits) == 1:
        return waits[0]
    return ", ".join(waits) or "different places"


# ------------------------------------------------------------------- rules

def peers_rule(processes: list[ProcessStack], context: VerdictContext) -> list[Culprit]:
    """Peers apart from where the others wait (groups of 2 too).

    A peer *blocked* elsewhere while the others wait or have returned; with
    no peer blocked, a peer that *returned* (its call ended, often with an
    error) while the others still wait in a collective it left.
    """
    culprits = []
    for actor_class, peers in sorted(peer_groups(processes).items()):
        waiting = [p for p in peers if p.activity == "waiting"]
        returned = [p for p in peers if p.activity == "returned"]
        blocked = [p for p in peers if p.activity == "blocked"]
        if blocked and (waiting or returned) and len(blocked) <= len(waiting) + len(returned):
            if not waiting:
                # Peers that returned are only a clue against a peer stuck in the user's own code.
                blocked = [p for p in blocked if _in_user_code(p)]
            if waiting:
                where = (f"{len(waiting)} of {len(peers)} {actor_class} peers ({_who(waiting)}) wait in "
                         f"{_common_wait(waiting)}")
            else:
                where = f"{len(returned)} of {len(peers)} {actor_class} peers ({_who(returned)}) have returned"
            for peer in blocked:
                culprits.append(make_culprit(peer, f"{headline(peer)} while {where}", "peers", evidence=where))
        elif returned and waiting and not blocked and len(returned) < len(waiting) and all(
                "(torch.distributed" in (p.wait or "") or "(torch.autograd" in (p.wait or "") for p in waiting):
            where = (f"{len(waiting)} of {len(peers)} {actor_class} peers ({_who(waiting)}) still wait in "
                     f"{_common_wait(waiting, point=True)}")
            for peer in returned:
                culprits.append(make_culprit(peer, f"left the collective: its call ended (returned or raised) while "
                                               f"{where}", "peers", evidence=where))
    return culprits


def _in_user_code(process: ProcessStack) -> bool:
    thread = key_thread(process)
    frames = frames_that_matter(thread) if thread else []
    return bool(frames) and not is_library(frames[0])


def chain_rule(processes: list[ProcessStack], context: VerdictContext) -> list[Culprit]:
    """Ends of wait-for chains blocked in the user's code (working ends are progress)."""
    chains, ends = wait_chains(processes, context.tasks)
    context.chains = chains
    culprits = []
    for end in ends:
        thread = key_thread(end)
        if thread is None or end.activity in ("working", "returned") or in_ray_wait(thread):
            continue
        frames = frames_that_matter(thread)
        if not frames or (is_library(frames[0]) and thread.idle):
            continue  # blocked in a library wait (event loop, lock, queue): it waits on something unseen
        path = next((chain for chain in chains if (chain[-1].node_ip, chain[-1].pid) == (end.node_ip, end.pid)), None)
        route = " → ".join(link.task_name or link.role for link in path) if path else end.task_name
        culprits.append(make_culprit(end, f"end of the wait-for chain {route}: {headline(end)}", "wait-for chain",
                                 evidence=route))
    return culprits


def dead_peer_rule(processes: list[ProcessStack], context: VerdictContext) -> list[Culprit]:
    """A rank whose process died while its live peers (same class, same job) wait."""
    culprits = []
    by_class: dict[str, list[ProcessStack]] = defaultdict(list)
    for process in processes:
        if process.actor_class and process.threads:
            by_class[process.actor_class].append(process)
    for dead in context.dead:
        if dead.get("on_purpose"):
            continue
        peers = [p for p in by_class.get(dead.get("actor_class") or "", [])
                 if not (dead.get("job_id") and p.job_id and p.job_id != dead.get("job_id"))]
        waiting = [p for p in peers if p.activity in ("waiting", "blocked")]
        if not waiting or any(p.activity == "working" for p in peers):
            continue
        live_ranks = {p.rank for p in peers if p.rank is not None}
        if dead.get("rank") is not None and dead["rank"] in live_ranks:
            continue  # that rank lives again (restarted)
        where = f"{len(waiting)} {dead.get('actor_class')} peers ({_who(waiting)}) wait in {_common_wait(waiting)}"
        who = f"rank {dead['rank']}" if dead.get("rank") is not None else f"pid {dead.get('pid')}"
        culprits.append(Culprit(
            pid=dead.get("pid") or 0, node_ip=dead.get("node_ip"), rank=dead.get("rank"),
            reason=f"{who} ({dead.get('actor_class')}) died: {dead.get('cause') or 'no cause recorded'}; {where}",
            actor_class=dead.get("actor_class"), actor_name=dead.get("actor_name"), rule="dead peer",
            rank_source=dead.get("rank_source"), evidence=dead.get("cause")))
    return culprits


def unreturned_rule(processes: list[ProcessStack], context: VerdictContext, *, batch_window: float = 2.0
                    ) -> list[Culprit]:
    """A rank that has not returned from a verl/pool call while the same call to its peers returned."""
    culprits = []
    batches: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for call in sorted(context.calls, key=lambda c: c.get("submitted") or 0):
        key = (call.get("kind"), call.get("method"))
        group = batches[key]
        if group and (call.get("submitted") or 0) - (group[-1][0].get("submitted") or 0) > batch_window:
            group.append([])
        if not group:
            group.append([])
        group[-1].append(call)
    by_rank = {p.rank: p for p in processes if p.rank is not None and p.role != "driver"}
    by_pid = {p.pid: p for p in processes}
    for (kind, method), group in sorted(batches.items(), key=lambda item: str(item[0])):
        for batch in group:
            done = [c for c in batch if c.get("returned")]
            open_calls = [c for c in batch if not c.get("returned")]
            if not done or not open_calls:
                continue
            for call in open_calls:
                process = (by_pid.get(call["worker_pid"]) if call.get("worker_pid")
                           else by_rank.get(call.get("rank")))
                if process is None or process.activity == "working":
                    continue  # not among the processes read (gone, another job), or slow but moving
                evidence = (f"rank {call.get('rank')} has not returned from {method} ({kind}) while ranks "
                            f"{sorted(c.get('rank') for c in done)} returned")
                culprits.append(make_culprit(process, f"{evidence}: {headline(process)}", "call not returned",
                                         evidence=evidence))
    return culprits


def collective_rule(processes: list[ProcessStack], context: VerdictContext) -> list[Culprit]:
    """Ranks that broke the collective sequence (issue 15's matcher, run on the ranks' own dumps).

    ``context.collective_positions`` holds the matcher's culprits (rank,
    reason, kind, file, line, pid, node_ip). It comes before the dead-peer
    rule: when a sequence mismatch makes gloo abort a process, the one that
    died is not always the one that skipped.

    Only processes of the job being looked at are named: a sampled process,
    or a dead actor of a job one of them belongs to. The store keeps the
    dumps of earlier jobs on the same cluster, and their ranks are not this
    hang's culprits.
    """
    culprits = []
    jobs = {p.job_id for p in processes if p.job_id}
    for item in context.collective_positions or []:
        pid, node_ip = item.get("pid"), item.get("node_ip")
        process = next((p for p in processes if p.pid == pid and (node_ip is None or p.node_ip in (None, node_ip))),
                       None)
        dead = next((d for d in context.dead if d.get("pid") == pid and d.get("job_id") in jobs), None)
        if process is None and dead is None:
            continue
        culprits.append(Culprit(
            pid=pid or 0, node_ip=node_ip or (process.node_ip if process else None), rank=item.get("rank"),
            reason=str(item.get("reason") or "broke the collective sequence"),
            actor_class=process.actor_class if process else None, actor_name=process.actor_name if process else None,
            function=item.get("function"), file=item.get("file"), line=item.get("line"), rule="collective positions",
            rank_source=(process.rank_source if process and process.rank_source else "collectives"),
            evidence=item.get("kind")))
    return culprits


BUILTIN_RULES: list[Rule] = [peers_rule, chain_rule, collective_rule, dead_peer_rule, unreturned_rule]


# ------------------------------------------------------------------- verdict

def _hung(processes: list[ProcessStack], samples: int) -> tuple[str | None, list[str]]:
    """With two samples: a peer group whose ranks all wait, none working → the hang's one-line summary."""
    notes = []
    for actor_class, peers in sorted(peer_groups(processes).items()):
        activities = {p.activity for p in peers}
        same_place = len({signature(p) for p in peers}) == 1 or (
            activities == {"waiting"} and len({p.wait for p in peers}) == 1)
        if activities <= {"waiting", "blocked"} and same_place:
            where = _common_wait(peers, point=True)
            if samples >= 2:
                return f"hung: every rank waits in {where}; no rank stands apart ({actor_class}, {_who(peers)})", notes
            notes.append(f"every {actor_class} rank waits in {where} in this one sample: "
                         "drop --once to tell a hang from a busy job")
    return None, notes


def build_verdict(processes: list[ProcessStack], tasks: list[RayTask] | None = None, *,
                  context: VerdictContext | None = None, extra_rules: list[Rule] | None = None) -> Verdict:
    """Every rule's culprits (first rule to name a process wins), the chains, the state and a summary."""
    context = context or VerdictContext()
    if tasks is not None:
        context.tasks = tasks
    for process in processes:
        classify(process)
    culprits: list[Culprit] = []
    named: set[tuple] = set()
    for rule in BUILTIN_RULES + EXTRA_RULES + list(extra_rules or []):
        try:
            found = rule(processes, context)
        except Exception as error:  # an extra rule must never cost the verdict
            found = []
            context.errors.append(f"rule {getattr(rule, '__name__', rule)} failed: {type(error).__name__}: {error}")
        for culprit in found:
            key = (culprit.node_ip, culprit.pid) if culprit.pid else ("rank", culprit.rank)
            if key not in named:
                culprits.append(culprit)
                named.add(key)
    verdict = Verdict(culprits=culprits, chains=context.chains, samples=context.samples)
    verdict.notes = list(context.errors)
    working = [p for p in processes if p.activity == "working" and p.role != "driver"]
    if culprits:
        verdict.state = "culprit"
        who = ", ".join((f"rank {c.rank}" if c.rank is not None else f"pid {c.pid}")
                        + (f" ({c.actor_class})" if c.actor_class else "") + f" [{c.rule}]" for c in culprits)
        verdict.summary = f"culprit{'s' if len(culprits) > 1 else ''}: {who}"
        first = culprits[0]
        verdict.next_command = NEXT_WHEN_CULPRIT.format(rank=first.rank) if first.rank is not None else (
            f"raysleuth stacks --pid {first.pid} --native")
        return verdict
    hung, notes = _hung(processes, context.samples)
    verdict.notes += notes
    if hung:
        verdict.state, verdict.summary, verdict.next_command = "hung", hung, NEXT_WHEN_HUNG
    elif not processes:
        verdict.state, verdict.summary = "unread", "no processes were read"
    elif working:
        verdict.state = "busy"
        verdict.summary = (f"no culprit: busy — {len(working)} process(es) working"
                           + (" (stacks moved between the samples)" if context.samples >= 2 else " (on CPU)"))
    else:
        verdict.state = "ok"
        verdict.summary = "no culprit: no peer stands apart and no wait-for chain ends in user code"
    return verdict
