"""One wait-for graph across layers: who waits for whom, and why.

Pure logic on processes already read and classified
(:mod:`raysleuth.stacks.progress`). Nodes are processes, dead processes,
coroutines and tasks waiting for resources; every edge is one "A waits for
B" with its evidence:

- ``ray call``: a process blocked in ``ray.get`` waits for the process
  running a call it submitted;
- ``queued call``: a call it submitted waits, queued, on an actor busy with
  another call: it waits for that actor (this closes actor cycles);
- ``collective``: a rank blocked in a collective waits for the peers of
  its group that are not in that collective (other op: a mismatch);
  ``peers``: the same for peers blocked in ``ray.get`` on calls we cannot
  see (a collective built on Ray calls);
- ``await``: an async actor whose loop is idle waits for the coroutine
  that has awaited one point far longer than its siblings;
- ``call not returned``: a driver waits for the rank whose verl / pool call
  has not returned while the same call to its peers did;
- ``dead peer``: a rank waits for a peer whose process died.

Only waiting and blocked processes have edges out: a process making
progress waits for nobody. Cycles are deadlocks; sinks explain the rest.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, defaultdict
from typing import Any

from raysleuth.cluster.records import RayTask
from raysleuth.stacks.analysis import awaits_off_main_thread, in_ray_wait, key_thread
from raysleuth.stacks.model import ProcessStack, WaitEdge
from raysleuth.stacks.peers import group_key, peer_groups

__all__ = ["STUCK_AWAIT_SECONDS", "WaitGraph", "build_graph", "node_key"]

DRIVER_TASK_PREFIX = "f" * 40
WAITING = ("waiting", "blocked")
PENDING_SECONDS = 30.0
"""A call not running after this long is what its caller waits on; a younger one is still being scheduled."""
STUCK_AWAIT_SECONDS = 5.0
"""A coroutine that has awaited one point this long (and longer than the whole capture window) while
its loop is idle is what its callers wait for."""


def node_key(process: ProcessStack) -> str:
    """The graph key of a process (pids repeat across nodes)."""
    return f"{process.node_ip}:{process.pid}"


@dataclasses.dataclass
class Node:
    key: str
    label: str
    state: str | None
    """The process's activity, or ``dead``, ``coroutine``, ``pending``."""
    process: ProcessStack | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class WaitGraph:
    nodes: dict[str, Node] = dataclasses.field(default_factory=dict)
    edges: list[WaitEdge] = dataclasses.field(default_factory=list)
    _out: dict[str, list[WaitEdge]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    _in: dict[str, list[WaitEdge]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    _sinks: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def add(self, node: Node) -> Node:
        return self.nodes.setdefault(node.key, node)

    def link(self, source: str, target: str, kind: str, evidence: str) -> None:
        if source != target and not any(e.target == target for e in self._out[source]):
            edge = WaitEdge(source=source, target=target, kind=kind, evidence=evidence)
            self.edges.append(edge)
            self._out[source].append(edge)
            self._in[target].append(edge)
            self._sinks.clear()

    def out(self, key: str) -> list[WaitEdge]:
        return list(self._out.get(key, ()))

    def into(self, key: str) -> list[WaitEdge]:
        return list(self._in.get(key, ()))

    def cycles(self) -> list[list[str]]:
        """Strongly connected groups of two or more nodes (Tarjan), each sorted."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        found: list[list[str]] = []
        successors = {source: [edge.target for edge in edges] for source, edges in self._out.items()}

        def visit(key: str) -> None:
            index[key] = low[key] = len(index)
            stack.append(key)
            for target in successors.get(key, ()):
                if target not in index:
                    visit(target)
                    low[key] = min(low[key], low[target])
                elif target in stack:
                    low[key] = min(low[key], index[target])
            if low[key] == index[key]:
                member, component = None, []
                while member != key:
                    member = stack.pop()
                    component.append(member)
                if len(component) > 1:
                    found.append(sorted(component))

        for key in list(self.nodes):
            if key not in index:
                visit(key)
        return found

    def sinks_from(self, key: str) -> list[str]:
        """Nodes reachable from ``key`` that wait for nobody (``key`` itself when it has no edge out); cached."""
        if key not in self._sinks:
            self._sinks[key] = self._walk_to_sinks(key)
        return self._sinks[key]

    def _walk_to_sinks(self, key: str) -> list[str]:
        seen, todo, sinks = {key}, [key], []
        while todo:
            current = todo.pop()
            targets = [edge.target for edge in self.out(current)]
            if not targets:
                sinks.append(current)
            for target in targets:
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return sinks

    def path(self, source: str, target: str) -> list[WaitEdge]:
        """The edges of one shortest path from ``source`` to ``target`` (empty when none)."""
        previous: dict[str, WaitEdge] = {}
        todo, seen = [source], {source}
        while todo:
            current = todo.pop(0)
            if current == target:
                break
            for edge in self.out(current):
                if edge.target not in seen:
                    seen.add(edge.target)
                    previous[edge.target] = edge
                    todo.append(edge.target)
        chain, current = [], target
        while current in previous:
            chain.append(previous[current])
            current = previous[current].source
        return list(reversed(chain)) if current == source else []


def build_graph(processes: list[ProcessStack], context: Any) -> WaitGraph:
    """Every edge the clues support (``context``: a :class:`raysleuth.stacks.verdict.VerdictContext`)."""
    graph = WaitGraph()
    for process in processes:
        graph.add(Node(node_key(process), process.label, process.activity, process))
    _ray_call_edges(graph, processes, context.tasks)
    _collective_edges(graph, processes, context.dead)
    _coroutine_edges(graph, processes, context.window)
    _unreturned_edges(graph, processes, context.calls)
    return graph


# ------------------------------------------------------------------ Ray calls

def _own_tasks(process: ProcessStack, running: dict[tuple, list[RayTask]]) -> list[str]:
    if process.role == "driver":
        return [DRIVER_TASK_PREFIX + process.job_id] if process.job_id else []
    own = [task.task_id for task in running.get((process.node_id, process.pid), [])]
    return own or ([process.task_id] if process.task_id else [])


def _ray_call_edges(graph: WaitGraph, processes: list[ProcessStack], tasks: list[RayTask]) -> None:
    running: dict[tuple, list[RayTask]] = defaultdict(list)
    children: dict[str, list[RayTask]] = defaultdict(list)
    for task in tasks:
        if task.state == "RUNNING" and task.worker_pid:
            running[(task.node_id, task.worker_pid)].append(task)
        if task.parent_task_id:
            children[task.parent_task_id].append(task)
    by_worker = {(p.node_id, p.pid): p for p in processes}
    by_actor = {p.actor_id: p for p in processes if p.actor_id}
    now = time.time()
    for process in processes:
        thread = key_thread(process)
        # A thread in ray.get waits for the calls it submitted; so does an async actor whose loop is idle
        # (its coroutines await them off the main thread: Ray Train's controller, an agent loop).
        if process.activity not in WAITING or thread is None or not (in_ray_wait(thread)
                                                                     or awaits_off_main_thread(process)):
            continue
        for own in _own_tasks(process, running):
            for call in children.get(own, []):
                _call_edge(graph, process, call, by_worker, by_actor, running, now)


def _call_edge(graph: WaitGraph, caller: ProcessStack, call: RayTask, by_worker: dict, by_actor: dict,
               running: dict, now: float) -> None:
    source = node_key(caller)
    name = call.name or call.function or call.task_id[:12]
    if call.state == "RUNNING" and call.worker_pid:
        target = by_worker.get((call.node_id, call.worker_pid))
        if target is not None:
            target.task_name = target.task_name or name
            graph.link(source, node_key(target), "ray call", f"waits in ray.get for {name}")
        return
    actor = by_actor.get(call.actor_id) if call.actor_id else None
    if actor is not None and call.type == "ACTOR_CREATION_TASK":
        return  # the actor is up (its process was read): a creation event the State API has not caught up with
    if actor is not None:
        busy = sorted({t.name or "?" for t in running.get((actor.node_id, actor.pid), [])}) or (
            [actor.task_name] if actor.task_name else [])
        behind = f" behind its running {', '.join(busy)}" if busy else ""
        graph.link(source, node_key(actor), "queued call",
                   f"waits for {name}, queued on {actor.actor_class or 'the actor'}{behind}")
        return
    key = f"pending:{call.task_id}"
    age = (now - call.creation_time_ms / 1000.0) if call.creation_time_ms else None
    # A call submitted a moment ago is being scheduled (progress); one that waits for long is what its caller waits on.
    state = "pending" if age is None or age >= PENDING_SECONDS else "working"
    graph.add(Node(key, f"task {name} ({call.state or 'pending'})", state,
                   detail={"task_id": call.task_id, "state": call.state, "age_s": age}))
    graph.link(source, key, "ray call", f"waits for {name}, not running yet ({call.state}): "
                                        "raysleuth tasks --pending says why")


# ------------------------------------------------------------------ collectives

def in_collective(process: ProcessStack) -> bool:
    """Blocked in a torch.distributed collective (or DDP's gradient all-reduce)."""
    wait = process.wait or ""
    return process.activity in WAITING and ("(torch.distributed" in wait or "(torch.autograd" in wait)


def _group_wait(process: ProcessStack, moving_calls: set[str]) -> bool:
    """Waits with its peers: in a collective, or in ``ray.get`` on calls that make no progress we can see
    (a collective built on Ray calls: a barrier actor, a parameter server)."""
    return in_collective(process) or (process.activity in WAITING and process.wait is not None
                                      and node_key(process) not in moving_calls)


def _collective_edges(graph: WaitGraph, processes: list[ProcessStack], dead: list[dict[str, Any]]) -> None:
    called = {edge.source for edge in graph.edges}
    moving_calls = {key for key in called if any(
        graph.nodes[sink].state in ("working", "active") for sink in graph.sinks_from(key))}
    for group, peers in peer_groups(processes).items():
        waiters = [p for p in peers if _group_wait(p, moving_calls)]
        if not waiters:
            continue
        counts = Counter(p.wait for p in waiters)
        ranked = counts.most_common()
        majority = ranked[0][0] if len(ranked) == 1 or ranked[0][1] > ranked[1][1] else None
        # Ranks in different ops: the majority waits for the few in another op; an even split has no
        # majority and no edge (the verdict cannot tell which side is wrong).
        minority = [p for p in waiters if majority is not None and p.wait != majority]
        elsewhere = [p for p in peers if not _group_wait(p, moving_calls)]
        for waiter in waiters:
            kind = "collective" if in_collective(waiter) else "peers"
            for peer in minority if waiter.wait == majority else ():
                graph.link(node_key(waiter), node_key(peer), kind,
                           f"in {_op(waiter)} while {_who(peer)} is in {_op(peer)}: the ops differ")
            for peer in elsewhere:
                graph.link(node_key(waiter), node_key(peer), kind,
                           f"waits in {_op(waiter)} for {_who(peer)}, which is not in it ({peer.activity})")
        live_ranks = {p.rank for p in peers if p.rank is not None}
        for item in dead:
            if item.get("on_purpose") or group_key(item.get("actor_class"), item.get("actor_name"),
                                                   item.get("job_id")) != group:
                continue
            if item.get("rank") is not None and item["rank"] in live_ranks:
                continue  # that rank lives again (restarted)
            key = f"dead:{item.get('node_ip')}:{item.get('pid')}"
            who = f"rank {item['rank']}" if item.get("rank") is not None else f"pid {item.get('pid')}"
            graph.add(Node(key, f"{who} {item.get('actor_class') or ''} (dead)".strip(), "dead", detail=item))
            for waiter in waiters:
                graph.link(node_key(waiter), key, "dead peer",
                           f"waits in {_op(waiter)} for {who}, whose process died: {item.get('cause') or '?'}")


def _op(process: ProcessStack) -> str:
    return (process.wait or "a collective").split(" (", 1)[0]


def _who(process: ProcessStack) -> str:
    return f"rank {process.rank}" if process.rank is not None else f"pid {process.pid}"


# ------------------------------------------------------------------ coroutines

def _coroutine_edges(graph: WaitGraph, processes: list[ProcessStack], window: float) -> None:
    for process in processes:
        if not process.coroutines or process.activity not in WAITING + ("returned", "active"):
            continue
        waited = sorted(float(t.get("waited_s") or 0.0) for t in process.coroutines)
        median = waited[len(waited) // 2] if waited else 0.0
        method = (process.task_name or "").rsplit(".", 1)[-1]
        serving = [t for t in process.coroutines if method and any(
            (f.get("function") or "").rsplit(".", 1)[-1] == method for f in t.get("frames") or [])]
        for item in serving or process.coroutines:  # the requests its callers wait for, when we can tell them
            seconds = float(item.get("waited_s") or 0.0)
            if seconds < max(STUCK_AWAIT_SECONDS, window) or (len(waited) > 2 and seconds < 4 * max(median, 0.5)):
                continue
            key = f"{node_key(process)}/coroutine:{item.get('task')}"
            where = coroutine_where(item)
            graph.add(Node(key, f"coroutine {item.get('task')} of {process.label}", "coroutine",
                           process=process, detail=item))
            graph.link(node_key(process), key, "await",
                       f"its event loop is idle while {item.get('task')} has awaited {item.get('awaits') or '?'} "
                       f"at {where} for {seconds:.0f}s")


def coroutine_where(item: dict[str, Any]) -> str:
    """The innermost frame of a coroutine outside asyncio itself: ``generate (engine.py:31)``."""
    frames = item.get("frames") or []
    mine = [f for f in frames if "/asyncio/" not in (f.get("file") or "")] or frames
    if not mine:
        return "?"
    frame = mine[-1]
    return f"{frame.get('function')} ({(frame.get('file') or '?').rsplit('/', 1)[-1]}:{frame.get('line')})"


# ------------------------------------------------------------------ recorded calls

def _unreturned_edges(graph: WaitGraph, processes: list[ProcessStack], calls: list[dict[str, Any]],
                      batch_window: float = 2.0) -> None:
    """A driver waits for the rank whose verl / pool call did not return while its peers' did."""
    drivers = [p for p in processes if p.role == "driver" and p.activity in WAITING]
    by_pid = {p.pid: p for p in processes}
    by_rank: dict[tuple[str | None, int | None], ProcessStack] = {
        (p.job_id, p.rank): p for p in processes if p.rank is not None and p.role != "driver"}
    batches: dict[tuple, list[list[dict[str, Any]]]] = defaultdict(list)
    for call in sorted(calls, key=lambda c: c.get("submitted") or 0):
        group = batches[(call.get("kind"), call.get("method"))]
        if not group or (call.get("submitted") or 0) - (group[-1][0].get("submitted") or 0) > batch_window:
            group.append([])
        group[-1].append(call)
    for (kind, method), group in sorted(batches.items(), key=lambda item: str(item[0])):
        for batch in group:
            done = sorted(c["rank"] for c in batch if c.get("returned") and c.get("rank") is not None)
            for call in (c for c in batch if not c.get("returned")) if done else ():
                # By pid; else by rank within the call's job only (the run keeps other jobs' calls, ranks 0..n-1 each)
                target = by_pid.get(call["worker_pid"]) if call.get("worker_pid") else by_rank.get(
                    (call.get("job_id"), call.get("rank")))
                if target is None or target.activity not in WAITING:
                    continue  # gone, another job, or slow but moving
                evidence = (f"rank {call.get('rank')} has not returned from {method} ({kind}) while ranks "
                            f"{done} returned")
                graph.nodes[node_key(target)].detail["not returned"] = evidence
                for driver in drivers:
                    graph.link(node_key(driver), node_key(target), "call not returned", evidence)
