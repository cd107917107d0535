"""Kinds of what went wrong: ``crash`` (capsules), ``death`` (classified deaths), ``consistency`` checks."""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth.evidence.base import Evidence, Part

__all__ = ["ChainLink", "Consistency", "ConsistencyMismatch", "Crash", "CrashFrame", "Death", "DeathFrame",
           "Explanation"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CrashFrame(Part):
    """One frame of a capsule (innermost last)."""

    file: str | None = None
    line: int | None = None
    function: str | None = None
    code: str | None = None
    locals: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChainLink(Part):
    """One exception of a capsule's chain (outermost first)."""

    relation: str | None = None
    type: str | None = None
    message: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Explanation(Part):
    """A knowledge-base match for a capsule's exception (``raysleuth explain``)."""

    title: str | None = None
    cause: str | None = None
    fix: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Crash(Evidence):
    """A crash capsule as stored (``CrashCapsule.to_dict()``)."""

    KIND = "crash"
    WRITTEN_BY = ("`postmortem.capture_exception` (`@rs.capture_crashes`, `rs.install_crash_capture`, "
                  "`rs.install_crash_capture_on_instance`); level `ERROR`; not for `asyncio.CancelledError`; at most "
                  "`MAX_CAPSULES` (20) per process per `CAPSULE_WINDOW_S` (60 s)")
    NAMED = "`<ActorClass>.<method>`, else the function's qualified name"
    NOTE = "locals redacted, environment redacted; `skipped_before`: capsules the rate limit skipped since the last"

    time: float | None = None
    rank: int | None = None
    world_size: int | None = None
    node_id: str | None = None
    node_ip: str | None = None
    hostname: str | None = None
    pid: int | None = None
    actor_id: str | None = None
    actor_name: str | None = None
    actor_class: str | None = None
    method: str | None = None
    exception_type: str = "?"
    message: str = ""
    chain: tuple[ChainLink, ...] = ()
    traceback: str = ""
    frames: tuple[CrashFrame, ...] = ()
    memory: dict[str, Any] = dataclasses.field(default_factory=dict)
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    step: int | None = None
    phase: str | None = None
    cause: str | None = None
    fix: str | None = None
    explanations: tuple[Explanation, ...] = ()
    errors: tuple[str, ...] = ()
    skipped_before: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeathFrame(Part):
    """One frame of a dead worker's last Python stack (most recent call first)."""

    file: str | None = None
    line: int | None = None
    function: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Death(Evidence):
    """A classified worker death as stored (``Death.to_dict()``)."""

    KIND = "death"
    WRITTEN_BY = ("the writer's death watch while the cluster lives (`deaths/watch.py`) and the last look at a "
                  "`raysleuth run` driver's exit; `raysleuth tasks --dead` / `crashes --collect` "
                  "(`deaths.record_deaths`); once per dead worker, with the *dead worker's* identity columns and "
                  "its rank, no client id; level `ERROR`")
    NAMED = "the classified cause (`deaths.causes.CAUSES`)"

    cause: str = "unknown"
    summary: str = ""
    evidence: tuple[str, ...] = ()
    signal: Any = None
    exit_code: int | None = None
    function: str | None = None
    file: str | None = None
    line: int | None = None
    stack: tuple[DeathFrame, ...] = ()
    exception_type: str | None = None
    exception_message: str | None = None
    top_memory_users: tuple[dict[str, Any], ...] = ()
    caller: str | None = None
    ray_reason: str | None = None
    rank: int | None = None
    rank_source: str | None = None
    world_size: int | None = None
    actor_id: str | None = None
    actor_class: str | None = None
    actor_name: str | None = None
    pid: int | None = None
    node_id: str | None = None
    node_ip: str | None = None
    task: str | None = None
    died_at: float | None = None
    last_stdout: tuple[str, ...] = ()
    last_stderr: tuple[str, ...] = ()
    memory_samples: tuple[dict[str, Any], ...] = ()
    peers: tuple[dict[str, Any], ...] = ()
    fix: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConsistencyMismatch(Part):
    """One tensor that differs across ranks."""

    name: str = "?"
    kind: str = "value"
    groups: tuple[tuple[int, ...], ...] = ()
    outlier_ranks: tuple[int, ...] = ()
    ambiguous: bool = False
    reference_rank: int | None = None
    first_index: Any = None
    max_abs_diff: Any = None
    max_rel_diff: Any = None
    diff_exact: bool = True
    differing_chunks: Any = None
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Consistency(Evidence):
    """A cross-rank consistency check as stored (``ConsistencyReport.to_dict()``).

    Version 1 (before b9da687) had no ``nothing_compared``: a check over 0 tensors was stored as
    consistent. It reads as version 2 does: not consistent, nothing compared.
    """

    KIND = "consistency"
    VERSION = 2
    WRITTEN_BY = ("`consistency.check_distributed_consistency` and its faces (`verify_distributed_tensors`, "
                  "`check_gradient_sync`, `check_data_consistency`): once per check, by the lowest rank that "
                  "arrived; `consistency.compare` (driver, rank column empty); level `ERROR` on mismatch, "
                  "`WARNING` when nothing was compared, else `INFO`; step column = the check's step")
    NAMED = "the check's `key` (`params`, `gradients`, `data`, the `operation_name`, `compare`)"
    NOTE = ("non-finite diffs as the strings `\"inf\"`/`\"nan\"`; ranks meet in writer mailbox topics "
            "`consistency/<job>/<key>/<step>/<n>[/fp|/rehash|/chunks][/ready]`, dropped when every rank is done")

    key: str = ""
    consistent: bool | None = None
    world_size: int | None = None
    step: int | None = None
    rank: int | None = None
    tensors_checked: int = 0
    nothing_compared: bool = False
    incomparable: tuple[str, ...] = ()
    mismatches: tuple[ConsistencyMismatch, ...] = ()
    within_tolerance: tuple[Any, ...] = ()
    arrived_ranks: tuple[int, ...] = ()
    missing_ranks: tuple[int, ...] = ()
    timeout: float | None = None
    atol: float | None = None
    rtol: float | None = None
    transport: str | None = None
    seconds: float | None = None
    error: str | None = None
    notes: tuple[str, ...] = ()
    outlier_ranks: tuple[int, ...] = ()

    @classmethod
    def version_of(cls, data: dict[str, Any]) -> int:
        """1 for a check stored before ``nothing_compared`` existed."""
        return 2 if "nothing_compared" in data else 1

    @classmethod
    def upgrade(cls, data: dict[str, Any], version: int) -> dict[str, Any]:
        """Version 1: a 'consistent' check over 0 tensors, with nothing wrong, compared nothing."""
        if version == 1 and data.get("consistent") is True and data.get("tensors_checked") == 0 \
                and not data.get("mismatches") and not data.get("missing_ranks") and data.get("error") is None:
            return {**data, "consistent": False, "nothing_compared": True}
        return data
