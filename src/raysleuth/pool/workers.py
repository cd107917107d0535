"""``RayResourcePool``: ranked Ray workers with debugging designed in."""

from __future__ import annotations

import functools
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from raysleuth import cluster, evidence, runtime
from raysleuth.errors import CaptureTimeout, UsageError, WorkerNotFound
from raysleuth.pool.allocator import AllocationPlan, SmartResourceAllocator, check_starts_together
from raysleuth.pool.instrument import InstrumentOptions, InstrumentedWorker, install_here, instrument
from raysleuth.postmortem import capture_exception
from raysleuth.recorder import get_client, open_store, record
from raysleuth.redaction import redact_text
from raysleuth.stacks import dump_stacks
from raysleuth.tracing import span

__all__ = ["PoolWorker", "RayResourcePool"]

log = logging.getLogger("raysleuth.pool")


def _function_name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


class PoolWorker:
    """Actor body of a pool worker: runs submitted functions, recording each call."""

    def __init__(self, rank: int, world_size: int, debug_mode: bool, options: InstrumentOptions) -> None:
        self.rank = rank
        self.world_size = world_size
        self.debug_mode = debug_mode
        self.state: dict[str, Any] = {}
        """Scratch space that submitted functions may use (``worker.state``)."""
        runtime.set_rank(rank, world_size)
        self.install = install_here(rank, world_size, options) if debug_mode else {"installed": ["rank"], "errors": []}

    def identity(self) -> dict[str, Any]:
        """Rank, pid, node and the instruments installed here."""
        me = runtime.whoami(refresh=True)
        return {**me.to_dict(), "installed": self.install["installed"], "errors": self.install["errors"]}

    def run(self, fn: Callable, args: tuple, kwargs: dict, call_id: str, debug_hook: bool) -> Any:
        """Run ``fn(*args, **kwargs)``; with ``debug_hook`` record start, end and failure."""
        if not debug_hook:
            return fn(*args, **kwargs)

        name = _function_name(fn)
        started = time.time()
        record("pool_call", {"call_id": call_id, "function": name, "state": "running"}, name=name)

        try:
            with span(name, call_id=call_id):
                result = fn(*args, **kwargs)
        except BaseException as error:
            record("pool_call", {"call_id": call_id, "function": name, "state": "failed",
                                 "duration_s": time.time() - started, "error": redact_text(f"{type(error).__name__}: {error}"[:2000])[:500]},
                   name=name, level="ERROR")
            if self.debug_mode:
                try:
                    capture_exception(error, method=name)
                except Exception:
                    pass
            raise
        record("pool_call", {"call_id": call_id, "function": name, "state": "finished",
                             "duration_s": time.time() - started}, name=name)
        return result


class RayResourcePool:
    """A pool of ranked Ray workers; ``debug_mode=True`` turns the instruments on in each.

    Every worker gets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and a stable actor
    name ``<name>_rank<r>``. ``gpu_memory_per_worker`` (GiB) becomes a GPU
    fraction of the node's GPU memory; when no GPU fits, the allocator's
    fallback applies (``cpu_backup`` by default: CPU workers and a warning,
    never actors pending forever).
    """

    def __init__(
        self,
        num_workers: int = 4,
        use_gpu: bool = False,
        debug_mode: bool = False,
        cpu_cores_per_worker: float = 1,
        gpu_memory_per_worker: float | None = None,
        *,
        name: str | None = None,
        allocator: SmartResourceAllocator | None = None,
        memory_watch: bool | None = None,
        memory_interval: float | None = None,
        env_vars: dict[str, str] | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if not ray.is_initialized():
            cluster.connect(start_local=True)
        self.name = name or f"raysleuth-pool-{uuid.uuid4().hex[:6]}"
        self.debug_mode = debug_mode
        self.allocator = allocator or SmartResourceAllocator()
        nodes = self.allocator.cluster_nodes()
        self.plan: AllocationPlan = self.allocator.plan(num_workers, use_gpu=use_gpu,
                                                        cpu_per_worker=cpu_cores_per_worker,
                                                        gpu_memory_per_worker=gpu_memory_per_worker, nodes=nodes)
        check_starts_together(self.plan, nodes)  # fail now, not after start_timeout
        self.warnings = list(self.plan.warnings)
        watch = debug_mode if memory_watch is None else memory_watch
        options = InstrumentOptions(memory_watch=watch, memory_interval=memory_interval)
        actor_class = ray.remote(PoolWorker)
        self.workers: list[Any] = []
        local_ranks: dict[str | None, itertools.count] = {}
        for placement in self.plan.placements:
            local_rank = next(local_ranks.setdefault(placement.node_id, itertools.count()))
            env = {"RANK": str(placement.rank), "WORLD_SIZE": str(num_workers), "LOCAL_RANK": str(local_rank),
                   **(env_vars or {})}
            if not placement.use_gpu:
                env.setdefault("CUDA_VISIBLE_DEVICES", "")
            extra: dict[str, Any] = {}
            if placement.node_id:
                extra["scheduling_strategy"] = NodeAffinitySchedulingStrategy(placement.node_id, soft=True)
            handle = actor_class.options(
                name=f"{self.name}_rank{placement.rank}",
                num_cpus=placement.num_cpus,
                num_gpus=placement.num_gpus,
                runtime_env={"env_vars": env},
                max_concurrency=4,
                **extra,
            ).remote(placement.rank, num_workers, debug_mode, options)
            self.workers.append(handle)
        refs = [worker.identity.remote() for worker in self.workers]
        try:
            self.identities: list[dict[str, Any]] = ray.get(refs, timeout=start_timeout)
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise CaptureTimeout(
                f"pool {self.name!r}: workers did not start within {start_timeout:g}s",
                fix="run `raysleuth tasks --pending` to see why their creation waits") from None
        self._next = itertools.count()

    @classmethod
    def for_debugging(cls, num_workers: int = 1, *, cpu_cores_per_worker: float = 0.1, **options: Any) -> "RayResourcePool":
        """A small debug pool that cannot starve training: no GPU, a CPU fraction per worker, instruments on."""
        options.pop("use_gpu", None)
        options.setdefault("name", f"raysleuth-debug-pool-{uuid.uuid4().hex[:6]}")
        return cls(num_workers=num_workers, use_gpu=False, debug_mode=True,
                   cpu_cores_per_worker=min(cpu_cores_per_worker, 0.25), **options)

    # ---------------------------------------------------------------- calls

    @property
    def world_size(self) -> int:
        """Number of workers."""
        return len(self.workers)

    def worker(self, rank: int) -> Any:
        """The actor handle of ``rank``."""
        if not 0 <= rank < len(self.workers):
            raise WorkerNotFound(f"no rank {rank} in pool {self.name!r} (ranks 0-{len(self.workers) - 1})")
        return self.workers[rank]

    def submit(self, fn: Callable, *args: Any, rank: int | None = None, debug_hook: bool = True, **kwargs: Any):
        """Run ``fn(*args, **kwargs)`` on a worker (``rank``, else round robin); returns an ObjectRef.

        With ``debug_hook`` the call's lifecycle is recorded as ``pool_call``
        evidence: submitted (here), running and finished/failed (in the worker).
        """
        if rank is None:
            rank = next(self._next) % len(self.workers)
        handle = self.worker(rank)
        call_id = uuid.uuid4().hex[:12]
        ref = handle.run.remote(fn, args, kwargs, call_id, debug_hook)
        if debug_hook:
            try:
                task_id = ref.task_id().hex()
            except Exception:
                task_id = None
            record("pool_call", {"call_id": call_id, "function": _function_name(fn), "state": "submitted",
                                 "task_id": task_id, "worker_rank": rank, "pool": self.name},
                   name=_function_name(fn))
        return ref

    def run_all(self, fn: Callable, *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """Run ``fn`` on every rank and return the results in rank order."""
        import ray

        return ray.get([self.submit(fn, *args, rank=rank, **kwargs) for rank in range(len(self.workers))],
                       timeout=timeout)

    def create_actors(self, actor_class: type, *args: Any, name_prefix: str | None = None,
                      num_cpus: float | None = None, **kwargs: Any) -> list[Any]:
        """Create one ``actor_class`` actor per rank (same placement, env and instruments as the pool)."""
        import ray

        remote_class: Any
        if hasattr(actor_class, "remote") and hasattr(actor_class, "options"):
            remote_class = actor_class
        else:
            remote_class = ray.remote(actor_class)
        prefix = name_prefix or f"{self.name}_{getattr(actor_class, '__name__', 'actor')}"
        handles = []
        for placement in self.plan.placements:
            env = {"RANK": str(placement.rank), "WORLD_SIZE": str(self.world_size)}
            handles.append(remote_class.options(
                name=f"{prefix}_rank{placement.rank}", num_cpus=placement.num_cpus if num_cpus is None else num_cpus,
                num_gpus=placement.num_gpus, runtime_env={"env_vars": env},
            ).remote(*args, **kwargs))
        instrument(handles, ranks=[p.rank for p in self.plan.placements], world_size=self.world_size,
                   memory_watch=False)
        self._user_actors = getattr(self, "_user_actors", []) + handles
        return handles

    # ------------------------------------------------------------ forensics

    def pids(self) -> list[int]:
        """Worker pids in rank order."""
        return [identity["pid"] for identity in self.identities]

    def stacks(self, **options: Any):
        """Grouped stacks of this pool's workers (see ``raysleuth.dump_stacks``)."""

        return dump_stacks(pids=self.pids(), **options)

    def compare(self, fn: Callable[[Any], Any], atol: float = 0, rtol: float = 0, **options: Any):
        """Run ``fn(worker)`` on every rank and compare the results (see ``raysleuth.compare``)."""
        # lazy: keeps the pool's import free of numpy and xxhash (fingerprints)
        from raysleuth.consistency import compare

        return compare(self.workers, fn, atol, rtol, **options)

    def calls(self, call_id: str | None = None) -> list[dict[str, Any]]:
        """The recorded lifecycle of submitted calls (from the evidence store), oldest first."""

        get_client().flush(timeout=10)
        store = open_store()
        rows = evidence.read(store, evidence.PoolCall)
        return [{"call_id": r.call_id, "state": r.state, "time": r.row.time, "rank": r.row.rank, "function": r.function,
                 **{k: v for k, v in r.to_data().items() if k in r.raw and k not in ("call_id", "state", "function")}}
                for r in rows if call_id is None or r.call_id == call_id]

    def shutdown(self) -> None:
        """Kill the pool's workers (and the actors it created)."""
        import ray

        for handle in list(self.workers) + list(getattr(self, "_user_actors", [])):
            try:
                ray.kill(handle)
            except Exception:
                pass
        self.workers = []

    def __enter__(self) -> "RayResourcePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
