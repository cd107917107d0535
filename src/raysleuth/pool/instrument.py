"""Install raysleuth's instruments inside worker processes, new or already running.

:func:`install_here` runs in the worker (rank, crash capture, log shipping,
memory watch) and reports what it installed and what failed; an instrument
that cannot be installed is reported, never raised. :func:`instrument`
reaches actors that already exist through ``__ray_call__``, so their class
does not change.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from raysleuth import cluster, memory, postmortem, ray_private, runtime
from raysleuth.errors import CaptureTimeout, UsageError
from raysleuth.logs import install_log_shipping
from raysleuth.recorder import get_client, record

__all__ = ["InstrumentOptions", "InstrumentedWorker", "install_here", "instrument"]

log = logging.getLogger("raysleuth.pool")


@dataclasses.dataclass(frozen=True, kw_only=True)
class InstrumentOptions:
    """Which instruments to install in a worker."""

    crash_capture: bool = True
    """Crash capsules for unhandled exceptions (process hooks and, in actors, every public method)."""
    log_shipping: bool = True
    """Ship stdlib logging records (root logger) to the evidence store with rank fields."""
    memory_watch: bool = False
    """Start the memory sampler."""
    memory_interval: float | None = None
    """Sampler interval in seconds (default: 1 s in full mode, else 10 s)."""
    env: dict[str, str] | None = None
    """Environment variables to set in the worker (e.g. RAYSLEUTH_MODE) before installing."""


@dataclasses.dataclass(kw_only=True)
class InstrumentedWorker:
    """One worker after instrumenting: who it is and what was installed."""

    rank: int
    rank_source: str
    pid: int | None = None
    node_id: str | None = None
    node_ip: str | None = None
    actor_id: str | None = None
    actor_name: str | None = None
    actor_class: str | None = None
    installed: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)


def install_here(rank: int | None, world_size: int | None, options: InstrumentOptions | None = None,
                 instance: Any = None) -> dict[str, Any]:
    """Install the instruments in this process (and on ``instance``'s methods). Never raises."""
    options = options or InstrumentOptions()
    installed: list[str] = []
    errors: list[str] = []
    try:
        if options.env:
            os.environ.update(options.env)
            runtime.reload_settings()
        if rank is not None:
            runtime.set_rank(rank, world_size)
            os.environ.setdefault("RANK", str(rank))
            if world_size is not None:
                os.environ.setdefault("WORLD_SIZE", str(world_size))
            installed.append("rank")
    except Exception as error:
        errors.append(f"rank: {error!r}")
    if options.crash_capture:
        try:
            postmortem.install_crash_capture()
            if instance is not None:
                postmortem.install_crash_capture_on_instance(instance)
            installed.append("crash_capture")
        except Exception as error:
            errors.append(f"crash_capture: {error!r}")
    if options.log_shipping:
        try:
            install_log_shipping()
            installed.append("log_shipping")
        except Exception as error:
            errors.append(f"log_shipping: {error!r}")
    if options.memory_watch:
        try:
            interval = options.memory_interval or (1.0 if runtime.settings().mode == "full" else 10.0)
            memory.watch(interval=interval)
            installed.append("memory_watch")
        except Exception as error:
            errors.append(f"memory_watch: {error!r}")
    me = runtime.whoami(refresh=True)
    try:
        record("event", {"installed": installed, "errors": errors}, name="instrumented")
        get_client().flush(timeout=10)
    except Exception as error:
        errors.append(f"record: {error!r}")
    return {"identity": me.to_dict(), "installed": installed, "errors": errors}


def _probe(instance: Any) -> dict[str, Any]:
    """Run inside an actor: what does it say about its rank?"""
    import ray

    context = ray.get_runtime_context()
    return {"env_rank": os.environ.get("RANK"), "env_world_size": os.environ.get("WORLD_SIZE"),
            "actor_name": context.get_actor_name() or None, "pid": os.getpid()}


def _install_in_actor(instance: Any, rank: int, world_size: int, options: InstrumentOptions) -> dict[str, Any]:
    return install_here(rank, world_size, options, instance=instance)


def _decide_ranks(probes: list[dict[str, Any]], ranks: Sequence[int] | None) -> list[tuple[int, str]]:
    """Explicit ranks, else every actor's RANK env, else every actor's name, else the order given."""
    if ranks is not None:
        if len(ranks) != len(probes):
            raise UsageError(f"{len(ranks)} ranks given for {len(probes)} actors", fix="give one rank per actor")
        return [(int(rank), "given") for rank in ranks]
    env_ranks = [probe.get("env_rank") for probe in probes]
    if all(value not in (None, "") for value in env_ranks):
        try:
            values = [int(value) for value in env_ranks if value is not None]  # none is None (checked above)
            if len(set(values)) == len(values):
                return [(value, "RANK env") for value in values]
        except ValueError:
            pass
    name_ranks = [cluster.rank_from_name(probe.get("actor_name")) for probe in probes]
    if all(value is not None for value in name_ranks) and len(set(name_ranks)) == len(name_ranks):
        return [(value, "actor name") for value in name_ranks]  # type: ignore[misc]
    return [(index, "order") for index in range(len(probes))]


def instrument(actor_handles: Sequence[Any], ranks: Sequence[int] | None = None, *,
               world_size: int | None = None, crash_capture: bool = True, log_shipping: bool = True,
               memory_watch: bool = False, memory_interval: float | None = None,
               timeout: float = 60.0) -> list[InstrumentedWorker]:
    """Install the instruments inside running actors, without changing their class.

    Ranks come from ``ranks`` (one per handle), else the actors' ``RANK``
    environment, else a rank in their names (``trainer_rank3``), else the
    order given. Each actor must be able to take one call (``__ray_call__``)
    within ``timeout``: a busy actor with ``max_concurrency=1`` is reported
    as :class:`CaptureTimeout` naming it.
    """
    import ray

    handles = list(actor_handles)
    if not handles:
        return []
    options = InstrumentOptions(crash_capture=crash_capture, log_shipping=log_shipping,
                                memory_watch=memory_watch, memory_interval=memory_interval)
    deadline = time.monotonic() + timeout
    probe_refs = [ray_private.ray_call(handle, _probe) for handle in handles]
    try:
        probes = ray.get(probe_refs, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        ready, _ = ray.wait(probe_refs, num_returns=len(probe_refs), timeout=0)
        busy = [index for index, ref in enumerate(probe_refs) if ref not in ready]
        raise CaptureTimeout(f"actors at positions {busy} did not answer within {timeout:g}s",
                             fix="instrument actors before they start long calls, or give them max_concurrency > 1") from None
    decided = _decide_ranks(probes, ranks)
    size = world_size or len(handles)
    refs = [ray_private.ray_call(handle, _install_in_actor, rank, size, options)
            for handle, (rank, _source) in zip(handles, decided)]
    results = ray.get(refs, timeout=max(1.0, deadline - time.monotonic()))
    workers = []
    for (rank, source), result in zip(decided, results):
        identity = result["identity"]
        workers.append(InstrumentedWorker(
            rank=rank, rank_source=source, pid=identity.get("pid"), node_id=identity.get("node_id"),
            node_ip=identity.get("node_ip"), actor_id=identity.get("actor_id"),
            actor_name=identity.get("actor_name"), actor_class=identity.get("actor_class"),
            installed=result["installed"], errors=result["errors"]))
        if result["errors"]:
            log.warning("raysleuth: rank %s: some instruments failed: %s", rank, "; ".join(result["errors"]))
    return workers
