"""raysleuth for verl: instrument a real ``RayWorkerGroup`` without changing verl.

``instrument(worker_group)``:

- maps verl's worker names (``<prefix><Class>_<pg>:<local_rank>``) and the
  ``RANK`` verl gives each worker to raysleuth ranks, and installs the
  instruments in every worker through ``__ray_call__`` (crash capsules on
  every registered method, log shipping, optionally the memory sampler);
- wraps the group's dispatch on the driver (``_execute_remote_single_worker``,
  which every registered method goes through) so each call is recorded per
  rank as ``verl_call`` evidence (submitted, then returned), and
  :meth:`VerlInstrumentation.outstanding` says *which rank has not returned
  from which method*, and for how long.

Environment variables: verl builds each worker's ``runtime_env`` itself and
replaces any you pass, so set raysleuth's variables through verl's
``worker_env``, e.g. ``RayWorkerGroup(..., worker_env={"RAYSLEUTH_DEBUG": "1"})``
(or ``RAYSLEUTH_MODE``, ``RAYSLEUTH_POST_MORTEM``); ``RANK``/``WORLD_SIZE``
are verl's own and must not be overridden.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from typing import Any

from raysleuth.errors import UsageError
from raysleuth.pool.instrument import InstrumentedWorker, instrument as instrument_actors
from raysleuth.recorder import record
from raysleuth.stacks.clues import recorded_calls, unreturned

__all__ = ["VerlCall", "VerlInstrumentation", "instrument", "parse_worker_name", "unreturned_calls"]

_NAME = re.compile(r"^(?P<prefix_class>.*)_(?P<pg>\d+):(?P<local_rank>\d+)$")


def parse_worker_name(name: str) -> dict[str, Any] | None:
    """Split a verl worker name ``<prefix><Class>_<pg>:<local_rank>``; None if it is not one."""
    match = _NAME.match(name or "")
    if not match:
        return None
    return {"prefix_class": match["prefix_class"], "placement_group": int(match["pg"]),
            "local_rank": int(match["local_rank"])}


@dataclasses.dataclass(kw_only=True)
class VerlCall:
    """One registered-method call on one rank, as seen from the driver."""

    method: str
    rank: int
    worker_name: str | None
    task_id: str | None
    submitted: float
    returned: float | None = None
    worker_pid: int | None = None
    """The worker process running the call (for stacks of that rank)."""

    @property
    def seconds(self) -> float:
        """How long it ran (or has been running)."""
        return (self.returned or time.time()) - self.submitted


class VerlInstrumentation:
    """What :func:`instrument` installed, and the driver-side view of calls in flight."""

    def __init__(self, worker_group: Any, workers: list[InstrumentedWorker], trace_calls: bool) -> None:
        self.worker_group = worker_group
        self.workers = workers
        self._rank_of = {id(handle): rank for rank, handle in enumerate(worker_group.workers)}
        self._names = list(getattr(worker_group, "worker_names", []) or [])
        self._calls: list[tuple[VerlCall, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._original = None
        if trace_calls:
            self._patch()
            self._thread = threading.Thread(target=self._watch, name="raysleuth-verl-calls", daemon=True)
            self._thread.start()

    # driver-side tracing -------------------------------------------------------

    def _patch(self) -> None:
        group = self.worker_group
        original = group._execute_remote_single_worker  # bound method of the class
        self._original = original

        def traced(worker, method_name, *args, **kwargs):
            ref = original(worker, method_name, *args, **kwargs)
            try:
                self._submitted(worker, method_name, ref)
            except Exception:
                pass  # tracing must never break the training step
            return ref

        group._execute_remote_single_worker = traced  # instance attribute shadows the class method

    def _submitted(self, worker: Any, method: str, ref: Any) -> None:
        rank = self._rank_of.get(id(worker))
        name = self._names[rank] if rank is not None and rank < len(self._names) else None
        try:
            task_id = ref.task_id().hex()
        except Exception:
            task_id = None
        pid = self.workers[rank].pid if rank is not None and rank < len(self.workers) else None
        call = VerlCall(method=method, rank=rank if rank is not None else -1, worker_name=name,
                        task_id=task_id, submitted=time.time(), worker_pid=pid)
        with self._lock:
            self._calls.append((call, ref))
        record("verl_call", {"method": method, "state": "submitted", "worker_name": name, "task_id": task_id,
                             "worker_pid": pid}, name=method, rank=rank)

    def _watch(self) -> None:
        import ray

        while not self._stop.wait(0.2):
            with self._lock:
                pending = [(call, ref) for call, ref in self._calls if call.returned is None]
            if not pending:
                continue
            try:
                ready, _ = ray.wait([ref for _, ref in pending], num_returns=len(pending), timeout=0,
                                    fetch_local=False)
            except Exception:
                continue
            done = set(ready)
            for call, ref in pending:
                if ref in done:
                    call.returned = time.time()
                    record("verl_call", {"method": call.method, "state": "returned", "worker_name": call.worker_name,
                                         "task_id": call.task_id, "duration_s": call.seconds},
                           name=call.method, rank=call.rank)
            with self._lock:  # keep the history bounded
                if len(self._calls) > 10_000:
                    self._calls = [(c, r) for c, r in self._calls if c.returned is None] + self._calls[-1000:]

    def outstanding(self, older_than: float = 0.0) -> list[VerlCall]:
        """Calls that have not returned (oldest first): which rank is still in which method."""
        with self._lock:
            return [call for call, _ in self._calls if call.returned is None and call.seconds >= older_than]

    def calls(self) -> list[VerlCall]:
        """Every traced call so far."""
        with self._lock:
            return [call for call, _ in self._calls]

    def pids(self) -> list[int]:
        """Worker pids in rank order (for ``raysleuth.dump_stacks(pids=...)``)."""
        return [worker.pid for worker in self.workers if worker.pid is not None]

    def close(self) -> None:
        """Stop tracing calls and restore the worker group's dispatch."""
        self._stop.set()
        if self._original is not None:
            try:
                del self.worker_group._execute_remote_single_worker
            except AttributeError:
                pass
            self._original = None


def instrument(worker_group: Any, *, crash_capture: bool = True, log_shipping: bool = True,
               memory_watch: bool = False, memory_interval: float | None = None, trace_calls: bool = True,
               timeout: float = 120.0) -> VerlInstrumentation:
    """Instrument every worker of a verl ``RayWorkerGroup`` and trace its dispatched calls.

    Ranks: verl's ``RANK`` (the index of the worker in the group); the
    worker names' local ranks are kept in ``worker_name``.
    """
    handles = list(getattr(worker_group, "workers", None) or [])
    if not handles:
        raise UsageError("this worker group has no workers",
                         fix="pass a verl RayWorkerGroup after it created its workers")
    if not hasattr(worker_group, "_execute_remote_single_worker"):
        raise UsageError(f"{type(worker_group).__name__} is not a verl RayWorkerGroup",
                         fix="pass verl.single_controller.ray.RayWorkerGroup (or use raysleuth.instrument for plain actors)")
    workers = instrument_actors(handles, ranks=list(range(len(handles))), world_size=len(handles),
                                crash_capture=crash_capture, log_shipping=log_shipping,
                                memory_watch=memory_watch, memory_interval=memory_interval, timeout=timeout)
    return VerlInstrumentation(worker_group, workers, trace_calls)


def unreturned_calls(run: str | None = None, *, home: Any = None, older_than: float = 0.0,
                     now: float | None = None) -> list[VerlCall]:
    """From the evidence store: calls submitted to a rank whose return was never recorded, oldest first.

    This is what ``raysleuth stacks`` prints next to its verdict, so the
    question *which rank has not returned from which method* is answered
    from outside the driver. A driver that died leaves its last calls here
    too: ``older_than`` and the submission time tell them apart.

    Scaling note: this reads every ``verl_call`` row of the run, and the
    watchdog calls it on each poll; fine for thousands of calls, but a long
    run should follow new rows by id (as the heartbeat reader does).
    """

    return [VerlCall(method=call["method"] or "?", rank=call["rank"] if call["rank"] is not None else -1,
                     worker_name=call["worker_name"], task_id=call["task_id"], submitted=call["submitted"],
                     worker_pid=call["worker_pid"])
            for call in unreturned(recorded_calls(run, home=home), older_than=older_than, now=now)]
