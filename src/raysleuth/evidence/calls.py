"""Kinds of calls and sessions: ``verl_call``, ``pool_call``, ``coroutines``, ``debug_session``, weight syncs."""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth.evidence.base import Evidence

__all__ = ["Coroutines", "DebugSessionRecord", "LogprobGap", "PoolCall", "VerlCall", "WeightSync"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerlCall(Evidence):
    """One registered-method call of a verl worker group, per rank: ``submitted`` then ``returned``."""

    KIND = "verl_call"
    WRITTEN_BY = "`integrations.verl.instrument` on the driver; rank column = the verl rank called"
    NAMED = "the method name"

    method: str | None = None
    state: str | None = None
    worker_name: str | None = None
    worker_pid: int | None = None
    task_id: str | None = None
    duration_s: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolCall(Evidence):
    """One call through ``RayResourcePool``: ``submitted`` (driver), ``running``, ``finished``/``failed`` (worker)."""

    KIND = "pool_call"
    WRITTEN_BY = ("`RayResourcePool.submit` (driver: `submitted`) and `PoolWorker.run` (worker: `running`, then "
                  "`finished` or `failed` with level `ERROR`)")
    NAMED = "the function's qualified name"

    call_id: str | None = None
    function: str | None = None
    state: str | None = None
    task_id: str | None = None
    worker_rank: int | None = None
    pool: str | None = None
    duration_s: float | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Coroutines(Evidence):
    """An async actor's pending asyncio tasks and what each awaits (longest waiting first, at most 2,000)."""

    KIND = "coroutines"
    WRITTEN_BY = ("`raysleuth.coroutines` in a worker (installed by the zero-code setup), on the control key "
                  "`coroutines.dump` (`raysleuth stacks` sets it between its samples)")
    NAMED = "`request`"

    pid: int | None = None
    time: float | None = None
    request: dict[str, Any] | None = None
    count: int | None = None
    tracked_since: float | None = None
    tasks: tuple[dict[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class DebugSessionRecord(Evidence):
    """Every state change of a hit breakpoint or post-mortem session (``DebugSession.to_dict()``)."""

    KIND = "debug_session"
    WRITTEN_BY = "`breakpoints` (every state change of a hit breakpoint or post-mortem)"
    NAMED = "the breakpoint's name (`post-mortem` for crashes)"
    NOTE = ("the secret itself is never recorded (`secret_file`: the 0600 file holding it); the latest state of "
            "each live session is also in the writer mailbox topic `debug_sessions`")

    id: str | None = None
    kind: str | None = None
    state: str | None = None
    host: str | None = None
    port: int | None = None
    rank: int | None = None
    pid: int | None = None
    node_id: str | None = None
    node_ip: str | None = None
    hostname: str | None = None
    actor_name: str | None = None
    actor_class: str | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    location: str | None = None
    since: float | None = None
    updated: float | None = None
    reason: str | None = None
    exception: str | None = None
    secret_file: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightSync(Evidence):
    """One side of one weight sync (``sent``, ``received``, ``loaded``): fingerprints, never tensors."""

    KIND = "weight_sync"
    WRITTEN_BY = ("`raysleuth.weights`: `rs.weights_sent` / `rs.weights_received` and verl's CheckpointEngine "
                  "under the zero-code setup (`source: verl:<engine class>`), once per side per sync; "
                  "`rs.check_weight_sync` (side `loaded`; level `ERROR` when not intact); step column = the version")
    NAMED = "the side: `sent`, `received`, `loaded`"
    NOTE = "`tensors`: `WeightPrint` dicts; `loaded` adds `tp_size` and `check` (`WeightCheck.to_dict()`)"

    side: str | None = None
    version: Any = None
    shard: Any = None
    rank: int | None = None
    pid: int | None = None
    source: str | None = None
    count: int | None = None
    items: int | None = None
    bytes: int | None = None
    seconds: float | None = None
    complete: bool | None = None
    canonical: Any = None
    error: str | None = None
    errors: Any = None
    tensors: tuple[dict[str, Any], ...] = ()
    tp_size: int | None = None
    check: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogprobGap(Evidence):
    """``rs.logprob_gap``: how far the trainer's logprobs are from the rollout's at one step."""

    KIND = "logprob_gap"
    WRITTEN_BY = "`rs.logprob_gap(rollout_logprobs, trainer_logprobs, step=)`"
    NAMED = "`logprob_gap`"
    NOTE = "`jump` is always false when written: jumps are judged over the whole run by the reader"

    step: int | None = None
    mean_abs: float | None = None
    max_abs: float | None = None
    tokens: int | None = None
    jump: bool = False
