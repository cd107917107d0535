"""Node agents: one small actor per alive node for work that must run locally.

An agent is a detached, named actor (``raysleuth-agent-<node_id>`` in the
``raysleuth`` namespace) pinned to its node, reserving no CPU. It lists the
node's Ray worker processes, runs a local tool (py-spy) with a timeout,
reads process memory with psutil and reports the node's versions. Its node's
workers poll it for the writer's controls (:mod:`raysleuth.agents.controls`:
one writer read per node, not per worker) and hand it their record
batches, which it sends to the writer together (:mod:`raysleuth.agents.relay`:
one writer call per node at a time, not per worker). When the writer asks, it
forwards its node's spool (evidence a worker could not
deliver before it died) to the writer (:mod:`raysleuth.agents.spools`).

Lifetime: agents are detached; the writer keeps one on every alive node, so
that each node's spool is forwarded, while a job that used raysleuth is
alive, and removes them once none has been for a while
(:mod:`raysleuth.agents.lifetime`; a command that asks for agents counts as
such a job while it runs). They reserve no CPU. :func:`remove_agents`
removes them all at once, and the writer then makes none (a command that
needs an agent makes it again). What callers may run and read through them is narrowed by
:mod:`raysleuth.agents.guard`.

:func:`call_agents` fans one method out to every node in parallel and
returns one :class:`AgentResult` per node, with the reason when a node did
not answer in time: partial results, never a hang.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import time
from typing import Any

from raysleuth import cluster
from raysleuth.agents.guard import check_paths, check_tool
from raysleuth.agents.host import (
    find_tool, gpus, oom_evidence, process_memory, py_spy_check, ray_train_lines, read_files, run_tool, versions,
    worker_logs,
)
from raysleuth.agents.controls import ControlRelay, CountRelay
from raysleuth.agents.lifetime import (
    _agent_names, _note_user, _own_names, existing_agents, kill_agents, remove_agents,
)
from raysleuth.agents.ranks import is_ray_worker, rank_hints, read_train_logs, thread_times
from raysleuth.agents.relay import RELAY_GROUP, RELAY_THREADS, DeliveryRelay
from raysleuth.agents.spools import SpoolForwarder
from raysleuth.cluster.own import AGENT_PREFIX, NAMESPACE, OWN_TASK_EVENTS
from raysleuth.errors import ClusterUnreachable

__all__ = ["AgentResult", "NodeAgent", "call_agents", "find_tool", "get_agents", "rank_hints", "read_train_logs",
           "existing_agents", "kill_agents", "remove_agents", "thread_times", "versions"]



class NodeAgent:
    """Actor body: local work on one node."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.hostname = socket.gethostname()
        self.started = time.time()
        self._spools = SpoolForwarder()
        self._controls = ControlRelay()
        self._counts = CountRelay()
        self._relay = DeliveryRelay()

    def ping(self) -> dict[str, Any]:
        """Who and where this agent is."""
        import ray

        return {
            "pid": self.pid,
            "hostname": self.hostname,
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "started": self.started,
        }

    def versions(self) -> dict[str, Any]:
        """Python, Ray, torch, raysleuth, py-spy versions on this node."""
        return versions()

    def list_processes(self, include_children: bool = True) -> list[dict[str, Any]]:
        """Ray worker processes on this node (and their children), with memory."""
        import psutil

        found = []
        workers: set[int] = set()
        for proc in psutil.process_iter(["pid", "ppid", "cmdline", "name", "create_time", "memory_info"]):
            info = proc.info
            cmdline = info.get("cmdline") or []
            if not is_ray_worker(cmdline) or info["pid"] == self.pid:
                continue
            workers.add(info["pid"])
            found.append({
                "pid": info["pid"],
                "ppid": info["ppid"],
                "title": cmdline[0] if cmdline and cmdline[0].startswith("ray::") else " ".join(cmdline)[:200],
                "parent_pid": None,
                "rss_bytes": info["memory_info"].rss if info.get("memory_info") else None,
                "create_time": info.get("create_time"),
            })
        if include_children:
            for pid in list(workers):
                try:
                    children = psutil.Process(pid).children(recursive=True)
                except psutil.Error:
                    continue
                for child in children:
                    if child.pid in workers:
                        continue
                    try:
                        found.append({
                            "pid": child.pid,
                            "ppid": child.ppid(),
                            "title": " ".join(child.cmdline())[:200],
                            "parent_pid": pid,
                            "rss_bytes": child.memory_info().rss,
                            "create_time": child.create_time(),
                        })
                    except psutil.Error:
                        continue
        return found

    def rank_hints(self, pids: list[int] | None = None) -> dict[str, Any]:
        """Ranks of this node's Ray workers from outside: start-up environment and Ray Train's logs."""

        self._train_cache = getattr(self, "_train_cache", {})
        # This node's workers are the children of its raylet, which is the agent's own parent.
        return rank_hints(pids, logs_dir=cluster.local_logs_dir(), cache=self._train_cache, parent=os.getppid())

    def thread_times(self, pids: list[int]) -> dict[int, dict[int, dict[str, float]]]:
        """Progress counters of each thread of each pid: CPU seconds, voluntary and involuntary switches."""
        return thread_times(pids)

    def run_tool(self, argv: list[str], timeout: float = 10.0) -> dict[str, Any]:
        """Run an allowed local tool (``ps``, ``py-spy dump``); returns returncode, stdout, stderr, timed_out, error."""
        check_tool(argv)
        return run_tool(argv, timeout)

    def run_tools(self, commands: list[list[str]], timeout: float = 10.0, parallel: int = 8,
                  interrupt_s: float = 0.0) -> list[dict[str, Any]]:
        """Run several allowed tools concurrently (each with ``timeout``, then ``interrupt_s`` to write what it has:
        :func:`run_tool`), results in order."""
        from concurrent.futures import ThreadPoolExecutor

        for argv in commands:
            check_tool(argv)

        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            return list(pool.map(lambda argv: run_tool(argv, timeout, interrupt_s), commands))

    def memory(self, pids: list[int]) -> dict[int, dict[str, Any]]:
        """RSS, USS (private) and VMS of each pid; an ``error`` for pids that are gone."""
        return process_memory(pids)

    def disk_free(self, path: str) -> dict[str, Any]:
        """Free and total bytes of the filesystem holding ``path``."""
        try:
            usage = shutil.disk_usage(path)
            return {"path": path, "free": usage.free, "total": usage.total}
        except OSError as error:
            return {"path": path, "error": str(error)}

    def py_spy_check(self) -> dict[str, Any]:
        """Is py-spy here, and may it read another process (ptrace)?"""
        return py_spy_check()

    def gpus(self) -> list[dict[str, Any]]:
        """This node's GPUs (index, name, total_bytes) from nvidia-smi; [] without one."""
        return gpus()

    def oom_evidence(self, since: float | None = None) -> dict[str, Any]:
        """Kernel-log OOM kills (where permitted) and cgroup OOM counts on this node (issue 18)."""
        return oom_evidence(since)

    def read_files(self, paths: list[str], tail_bytes: int = 65536) -> dict[str, str | None]:
        """The tail of each local file (None when absent or unreadable) under Ray's session folder,
        ``$RAYSLEUTH_HOME`` or ``/proc`` of a Ray worker; any other path is refused."""
        check_paths(paths)
        return read_files(paths, tail_bytes)

    def forward_spools(self, writer: Any) -> dict[str, Any]:
        """Send this node's abandoned spool files of the run to ``writer`` (the writer's handle); what was sent."""
        return self._spools.forward(writer)

    def get_controls(self) -> dict[str, Any] | None:
        """The writer's controls, read at most once per ``CONTROL_TTL_S`` for every worker of this node; None
        while a slow read is under way and the last is too old to serve (``agents.controls.STALE_LIMIT_S``)."""
        return self._controls.get()

    def count(self, topic: str) -> int:
        """How many ranks posted under a meeting's topic (read at most once per ``COUNT_TTL_S`` for the node)."""
        return self._counts.get(topic)

    def deliver(self, header: dict[str, Any], rows: list, timeout: float = 10.0) -> int:
        """Store one batch of a worker of this node through the writer, with the node's other batches in one
        writer call (:mod:`raysleuth.agents.relay`); returns once it is stored, raises when it was not."""
        return self._relay.deliver(header, rows, timeout)

    def relayed(self) -> dict[str, dict[str, int]]:
        """Control polls, meeting counts and record batches this agent relayed, and the writer calls they took."""
        return {"controls": self._controls.totals(), "counts": self._counts.totals(),
                "deliveries": self._relay.totals()}

    def forwarded(self) -> dict[str, Any]:
        """Spool files and rows this agent forwarded so far."""
        return self._spools.totals()

    def worker_logs(self, pids: list[int], lines: int = 200) -> dict[int, dict[str, Any]]:
        """Last lines of each pid's Ray worker ``.err``/``.out`` logs and raysleuth fatal file on this node."""
        return worker_logs(pids, lines)

    def ray_train_lines(self, lines: int = 50) -> list[str]:
        """Lines naming a ``world_rank`` from Ray Train's worker logs on this node (``logs/train/``)."""
        return ray_train_lines(lines)


@dataclasses.dataclass
class AgentResult:
    """One node's answer to a fanned-out call."""

    node_id: str
    node_ip: str | None
    ok: bool
    value: Any = None
    error: str | None = None


_handles: dict[tuple[str, str], Any] = {}
"""Agent handles found so far, by (Ray session, node id): a fan-out looks up only agents it has not seen."""


def get_agents(*, timeout: float = 30.0) -> dict[str, Any]:
    """One agent handle per alive node (created on demand, then reused).

    One listing of the named actors (one GCS call) says which agents exist;
    handles already held are reused, the others are looked up in parallel,
    and a node without an agent gets one. So a command that fans out several
    times costs one listing and one node listing per fan-out, not a lookup per
    node each time. (At 10,000+ named actors the listing itself is the next
    cost: a name-prefix filter in the GCS would be the next step.)
    """
    import ray

    if not ray.is_initialized():
        raise ClusterUnreachable("not connected to Ray", fix="connect first (raysleuth.cluster.connect)")
    session = cluster.session_name() or "?"
    nodes = {node.node_id: node.node_ip for node in cluster.nodes(alive_only=True) if node.node_id}
    own = _own_names()
    existing = set(_agent_names(own))
    _note_user(session, own)
    for key in [key for key in _handles if key[0] == session and (key[1] not in nodes
                                                                 or AGENT_PREFIX + key[1][:16] not in existing)]:
        del _handles[key]  # the node or its agent is gone
    missing = [node_id for node_id in nodes if (session, node_id) not in _handles]
    if missing:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(16, len(missing))) as pool:
            found = pool.map(lambda node_id: _agent(node_id, AGENT_PREFIX + node_id[:16] in existing), missing)
            _handles.update({(session, node_id): handle for node_id, handle in zip(missing, found)})
    return {node_id: (_handles[(session, node_id)], node_ip) for node_id, node_ip in nodes.items()}


def _agent(node_id: str, exists: bool) -> Any:
    """The agent of ``node_id``: looked up when it exists, else created there."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = AGENT_PREFIX + node_id[:16]
    if exists:
        try:
            return ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            pass  # gone since the listing
    # its deliveries wait in their own threads (a public decorator, applied where Ray is imported)
    NodeAgent.deliver = ray.method(concurrency_group=RELAY_GROUP)(NodeAgent.deliver)  # type: ignore[method-assign]
    remote = ray.remote(concurrency_groups={RELAY_GROUP: RELAY_THREADS})  # type: ignore[call-overload]
    return remote(NodeAgent).options(
        name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0, max_concurrency=16,
        max_restarts=3, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        enable_task_events=OWN_TASK_EVENTS,
    ).remote()


def call_agents(method: str, *args: Any, timeout: float = 30.0, nodes: list[str] | None = None,
                per_node_args: dict[str, tuple] | None = None) -> list[AgentResult]:
    """Call ``method`` on every node's agent in parallel; partial results on timeout.

    ``per_node_args`` gives node-specific arguments (node_id -> args tuple);
    such nodes get those instead of ``args``.
    """
    import ray

    agents = get_agents(timeout=timeout)
    wanted = {node_id: value for node_id, value in agents.items() if nodes is None or node_id in nodes}
    refs = {}
    refused: dict[str, str] = {}
    for node_id, (handle, _ip) in wanted.items():
        call_args = per_node_args.get(node_id, args) if per_node_args else args
        try:
            refs[node_id] = getattr(handle, method).remote(*call_args)
        except Exception as error:  # a handle without that method: an agent of another raysleuth
            refused[node_id] = _agent_error(error)
    deadline = time.monotonic() + timeout
    pending = list(refs.values())
    while pending and time.monotonic() < deadline:
        _ready, pending = ray.wait(pending, num_returns=len(pending), timeout=max(0.0, deadline - time.monotonic()))
    results = [AgentResult(node_id, wanted[node_id][1], False, error=error) for node_id, error in refused.items()]
    for node_id, ref in refs.items():
        node_ip = wanted[node_id][1]
        if ref in pending:
            results.append(AgentResult(node_id, node_ip, False,
                                       error=f"no answer from the agent on {node_ip} within {timeout:g}s"))
            continue
        try:
            results.append(AgentResult(node_id, node_ip, True, value=ray.get(ref)))
        except Exception as error:
            results.append(AgentResult(node_id, node_ip, False, error=_agent_error(error)))
    return results


STALE_AGENT = ("an agent made by another raysleuth version (agents live as long as the cluster) takes other calls: "
               "remove the agents (python -c \"import ray, raysleuth.agents as a; ray.init(address='auto'); "
               "print(a.remove_agents())\") and the next command makes them again")


def _agent_error(error: Exception) -> str:
    """A failed agent call in a line, with :data:`STALE_AGENT` where the call did not fit the agent's code."""
    cause = getattr(error, "cause", error)  # a RayTaskError carries the agent's own exception
    unfit = isinstance(cause, AttributeError) or (isinstance(cause, TypeError) and "argument" in str(cause))
    return f"{type(error).__name__}: {str(error)[:300]}" + (f" ({STALE_AGENT})" if unfit else "")
