"""Place workers on nodes that fit, and fall back instead of pending forever.

:func:`plan_placements` is pure: nodes (with their GPU memory when known)
in, one :class:`Placement` per worker out, with the reason. The
:class:`SmartResourceAllocator` reads the live cluster (nodes from the
State API, GPU memory from each node's agent via ``nvidia-smi``) and plans.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from raysleuth import agents, cluster
from raysleuth.errors import UsageError

__all__ = ["AllocationPlan", "Placement", "SmartResourceAllocator", "check_starts_together", "plan_placements"]

log = logging.getLogger("raysleuth.pool")

GiB = 1024**3
STRATEGIES = ("cpu_backup", "wait", "fail")


@dataclasses.dataclass(kw_only=True)
class Placement:
    """Where one worker goes and what it asks for."""

    rank: int
    node_id: str | None
    node_ip: str | None
    num_cpus: float
    num_gpus: float
    use_gpu: bool
    fallback: bool = False
    reason: str = ""


@dataclasses.dataclass(kw_only=True)
class AllocationPlan:
    """The placements, the warnings raised on the way, and the strategy used."""

    placements: list[Placement]
    warnings: list[str] = dataclasses.field(default_factory=list)
    strategy: str = "cpu_backup"

    @property
    def fell_back(self) -> bool:
        """True when any worker was moved to CPU."""
        return any(placement.fallback for placement in self.placements)

    def explain(self) -> str:
        """One line per worker: where, what, why."""
        lines = [f"rank {p.rank}: {p.node_ip or 'any node'} cpus={p.num_cpus:g} gpus={p.num_gpus:g}"
                 f"{' (CPU fallback)' if p.fallback else ''}: {p.reason}" for p in self.placements]
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])


@dataclasses.dataclass(frozen=True)
class _Request:
    """What each worker asks for (memory amounts in GiB), and what to do when no GPU fits."""

    use_gpu: bool
    cpu_per_worker: float
    gpu_memory_per_worker: float | None
    min_gpu_memory: float | None
    preferred_node_type: str | None
    fallback_strategy: str

    def preferred(self, node: dict[str, Any]) -> bool:
        """Whether ``node`` is of the preferred type (a label value, a resource, an accelerator type)."""
        if not self.preferred_node_type:
            return False
        labels = node.get("labels") or {}
        resources = node.get("resources_total") or {}
        return self.preferred_node_type in labels.values() or self.preferred_node_type in resources \
            or f"accelerator_type:{self.preferred_node_type}" in resources


def plan_placements(
    nodes: list[dict[str, Any]],
    num_workers: int,
    *,
    use_gpu: bool,
    cpu_per_worker: float = 1.0,
    gpu_memory_per_worker: float | None = None,
    min_gpu_memory: float | None = None,
    preferred_node_type: str | None = None,
    fallback_strategy: str = "cpu_backup",
) -> AllocationPlan:
    """Assign workers to nodes (first fit, preferred nodes first).

    ``nodes``: dicts with ``node_id``, ``node_ip``, ``resources_total``
    (``CPU``, ``GPU``, ...), ``labels`` and optional ``gpu_memory_bytes``
    (per GPU). Memory amounts are in GiB. ``gpu_memory_per_worker`` becomes a
    GPU fraction of that node's GPU memory.
    """
    _check_request(nodes, num_workers, cpu_per_worker, fallback_strategy)
    request = _Request(use_gpu=use_gpu, cpu_per_worker=cpu_per_worker, gpu_memory_per_worker=gpu_memory_per_worker,
                       min_gpu_memory=min_gpu_memory, preferred_node_type=preferred_node_type,
                       fallback_strategy=fallback_strategy)
    free = {node["node_id"]: dict(node.get("resources_total") or {}) for node in nodes}
    ordered = sorted(nodes, key=lambda node: (not request.preferred(node), not node.get("is_head_node", False)))
    placements: list[Placement] = []
    warnings: list[str] = []
    for rank in range(num_workers):
        placed = None
        if use_gpu:
            placed = _place_on_gpu(rank, ordered, free, request)
            if placed is None:
                placed = _no_gpu_fits(rank, request, warnings)
        if placed is None:
            placed = _place_on_cpu(rank, ordered, free, request)
        if placed is None:
            warning = f"rank {rank}: no node has {cpu_per_worker:g} free CPU; it will queue until one frees up"
            warnings.append(warning)
            placed = Placement(rank=rank, node_id=None, node_ip=None, num_cpus=cpu_per_worker, num_gpus=0.0,
                               use_gpu=False, fallback=use_gpu, reason="queued: cluster CPUs are all planned")
        placements.append(placed)
    return AllocationPlan(placements=placements, warnings=warnings, strategy=fallback_strategy)


def _check_request(nodes: list[dict[str, Any]], num_workers: int, cpu_per_worker: float,
                   fallback_strategy: str) -> None:
    """Raise for a request no plan can serve: an unknown strategy, no workers, a worker bigger than any node."""
    if fallback_strategy not in STRATEGIES:
        raise UsageError(f"fallback_strategy={fallback_strategy!r} is not one of {', '.join(STRATEGIES)}")
    if num_workers < 1:
        raise UsageError(f"num_workers must be at least 1, got {num_workers}")
    largest = max(((node.get("resources_total") or {}).get("CPU", 0.0) for node in nodes), default=None)
    if largest is not None and cpu_per_worker > largest + 1e-9:
        # waiting is pointless: no node will ever have this much, whatever frees up
        raise UsageError(
            f"no node can ever hold a worker of {cpu_per_worker:g} CPU: the largest node has {largest:g} CPU",
            fix=f"ask for at most {largest:g} CPU per worker (fractions such as 0.5 work), or add a bigger node")


def _place_on_gpu(rank: int, ordered: list[dict[str, Any]], free: dict[str, dict[str, float]],
                  request: _Request) -> Placement | None:
    """The first node with enough GPU (memory) and CPU left, taken from ``free``; None when none has."""
    for node in ordered:
        room = free[node["node_id"]]
        gpus = room.get("GPU", 0.0)
        memory = node.get("gpu_memory_bytes")
        if request.min_gpu_memory and memory is not None and memory < request.min_gpu_memory * GiB:
            continue
        if request.gpu_memory_per_worker and memory:
            fraction = min(1.0, math.ceil(request.gpu_memory_per_worker * GiB / memory * 100) / 100)
        else:
            fraction = 1.0
        if gpus + 1e-9 >= fraction and room.get("CPU", 0.0) + 1e-9 >= request.cpu_per_worker:
            room["GPU"] = gpus - fraction
            room["CPU"] = room.get("CPU", 0.0) - request.cpu_per_worker
            why = f"{fraction:g} GPU" + (f" of {memory / GiB:.0f} GiB" if memory else "")
            if request.preferred(node):
                why += f", preferred node type {request.preferred_node_type}"
            return Placement(rank=rank, node_id=node["node_id"], node_ip=node.get("node_ip"),
                             num_cpus=request.cpu_per_worker, num_gpus=fraction, use_gpu=True, reason=why)
    return None


def _no_gpu_fits(rank: int, request: _Request, warnings: list[str]) -> Placement | None:
    """The fallback strategy for a rank no GPU fits: raise (fail), a pending GPU placement (wait), or None
    with a warning (cpu_backup: the caller places it on a CPU)."""
    need = f"{request.gpu_memory_per_worker:g} GiB of GPU memory" if request.gpu_memory_per_worker else "a GPU"
    if request.min_gpu_memory:
        need += f" on a GPU of at least {request.min_gpu_memory:g} GiB"
    if request.fallback_strategy == "fail":
        raise UsageError(f"no node can give rank {rank} {need}",
                         fix="lower the request, add GPU nodes, or use fallback_strategy='cpu_backup'")
    if request.fallback_strategy == "wait":
        warning = f"rank {rank}: no node has {need} now; its actor will wait for one (pending)"
        warnings.append(warning)
        log.warning("raysleuth: %s", warning)
        return Placement(rank=rank, node_id=None, node_ip=None, num_cpus=request.cpu_per_worker,
                         num_gpus=1.0, use_gpu=True, reason="waits for a GPU")
    warning = f"rank {rank}: no node has {need}; falling back to a CPU worker (cpu_backup)"
    warnings.append(warning)
    log.warning("raysleuth: %s", warning)
    return None


def _place_on_cpu(rank: int, ordered: list[dict[str, Any]], free: dict[str, dict[str, float]],
                  request: _Request) -> Placement | None:
    """The first node with enough CPU left, taken from ``free``; None when none has."""
    for node in ordered:
        room = free[node["node_id"]]
        if room.get("CPU", 0.0) + 1e-9 >= request.cpu_per_worker:
            room["CPU"] = room.get("CPU", 0.0) - request.cpu_per_worker
            return Placement(rank=rank, node_id=node["node_id"], node_ip=node.get("node_ip"),
                             num_cpus=request.cpu_per_worker, num_gpus=0.0, use_gpu=False,
                             fallback=request.use_gpu, reason=f"{request.cpu_per_worker:g} CPU")
    return None


def check_starts_together(plan: AllocationPlan, nodes: list[dict[str, Any]]) -> None:
    """Raise when the plan's workers can never all run at once on these nodes (a pool needs every rank).

    The plan queues ranks for which the cluster's *total* CPU is planned
    already: nothing will free up while the pool's own workers hold it.
    """
    queued = [p.rank for p in plan.placements if p.node_id is None and p.reason.startswith("queued")]
    if not queued:
        return
    total = sum((node.get("resources_total") or {}).get("CPU", 0.0) for node in nodes)
    count = len(plan.placements)
    each = plan.placements[0].num_cpus
    fits = max(1, int(total // each)) if each else count
    raise UsageError(
        f"{count} workers x {each:g} CPU need {count * each:g} CPU, but the cluster has {total:g} CPU in all: "
        f"rank(s) {', '.join(map(str, queued))} could never start while the others run",
        fix=f"use cpu_cores_per_worker={math.floor(total / count * 100) / 100:g} or num_workers={fits}, "
            "or add nodes")


class SmartResourceAllocator:
    """Plans worker placement on the live cluster, with a fallback when GPUs don't fit."""

    def __init__(self, min_gpu_memory: float | None = None, preferred_node_type: str | None = None,
                 fallback_strategy: str = "cpu_backup") -> None:
        if fallback_strategy not in STRATEGIES:
            raise UsageError(f"fallback_strategy={fallback_strategy!r} is not one of {', '.join(STRATEGIES)}")
        self.min_gpu_memory = min_gpu_memory
        self.preferred_node_type = preferred_node_type
        self.fallback_strategy = fallback_strategy

    def cluster_nodes(self) -> list[dict[str, Any]]:
        """Alive nodes, with per-GPU memory read on GPU nodes through their agents."""

        nodes = [node.to_dict() for node in cluster.nodes(alive_only=True)]
        gpu_nodes = [node["node_id"] for node in nodes if node["resources_total"].get("GPU", 0) > 0]
        if gpu_nodes:
            for result in agents.call_agents("gpus", timeout=30, nodes=gpu_nodes):
                if result.ok and result.value:
                    memory = min(gpu["total_bytes"] for gpu in result.value)
                    for node in nodes:
                        if node["node_id"] == result.node_id:
                            node["gpu_memory_bytes"] = memory
        return nodes

    def plan(self, num_workers: int, *, use_gpu: bool, cpu_per_worker: float = 1.0,
             gpu_memory_per_worker: float | None = None, nodes: list[dict[str, Any]] | None = None) -> AllocationPlan:
        """Plan ``num_workers`` placements on the cluster this process is connected to (or on ``nodes``)."""
        return plan_placements(self.cluster_nodes() if nodes is None else nodes, num_workers, use_gpu=use_gpu, cpu_per_worker=cpu_per_worker,
                               gpu_memory_per_worker=gpu_memory_per_worker, min_gpu_memory=self.min_gpu_memory,
                               preferred_node_type=self.preferred_node_type,
                               fallback_strategy=self.fallback_strategy)
