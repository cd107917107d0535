"""The named ``event`` records raysleuth itself writes (each one's ``name`` column picks its class)."""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth.evidence.base import Evidence

__all__ = ["CapsulesSkipped", "Finished", "Instrumented", "RankKnown", "SpoolDropped", "Stall"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stall(Evidence):
    """The stall watchdog saw ranks stop progressing; level ``ERROR``."""

    KIND, NAME = "event", "stall"
    WRITTEN_BY = "the stall watchdog when ranks stop progressing; level `ERROR`"
    NAMED = "`stall`"

    summary: str = ""
    stalled: tuple[dict[str, Any], ...] = ()
    """rank, step, last_beat, last_progress, pid, node_ip, actor_class."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finished(Evidence):
    """Every rank stopped because its loop returned: not a stall; level ``INFO``."""

    KIND, NAME = "event", "finished"
    WRITTEN_BY = "the stall watchdog when every rank's loop returned (no running call, no own code); level `INFO`"
    NAMED = "`finished`"

    summary: str = ""
    ranks: tuple[dict[str, Any], ...] = ()
    """As :attr:`Stall.stalled`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CapsulesSkipped(Evidence):
    """The crash capture's rate limit skipped capsules; level ``WARNING``."""

    KIND, NAME = "event", "capsules_skipped"
    WRITTEN_BY = "`postmortem.capture_exception`, at the first capsule a burst skips (rate limit); level `WARNING`"
    NAMED = "`capsules_skipped`"

    reason: str = ""
    max_capsules: int | None = None
    window_s: float | None = None
    exception_type: str | None = None
    method: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpoolDropped(Evidence):
    """A spool file's drop note: rows that did not fit under the cap while the writer was out of reach."""

    KIND, NAME = "event", "spool_dropped"
    WRITTEN_BY = "a spool file's drop note, stored when the file is delivered; level `WARNING`; seq negative"
    NAMED = "`spool_dropped`"

    dropped_rows: int | None = None
    cap_bytes: int | None = None
    spool: str | None = None
    message: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Instrumented(Evidence):
    """What a worker's instruments installed (``pool.install_here``, or the zero-code setup with ``source``)."""

    KIND, NAME = "event", "instrumented"
    WRITTEN_BY = ("`pool.install_here` in each worker `instrument`/`RayResourcePool(debug_mode=True)` reached; "
                  "`raysleuth.setup_worker` (`source: worker_setup`) once the deferred parts are in, level "
                  "`WARNING` when a part failed; again (`late`) for a part that answered after it (the death watch)")
    NAMED = "`instrumented`"

    installed: tuple[str, ...] = ()
    errors: Any = None
    """``part: reason`` strings."""
    source: str | None = None
    setup_ms: float | None = None
    timings_ms: dict[str, Any] = dataclasses.field(default_factory=dict)
    mode: str | None = None
    pending: tuple[str, ...] = ()
    """Parts asked and not answered yet (the writer's death watch on a loaded node): a ``late`` record follows."""
    late: bool | None = None
    """True: the outcome of a part that was pending (in ``installed`` or ``errors``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankKnown(Evidence):
    """A worker's rank became known (env, Ray Train, torch.distributed); rank column set."""

    KIND, NAME = "event", "rank"
    WRITTEN_BY = "the zero-code setup, once per worker when its rank becomes known"
    NAMED = "`rank`"

    rank: int | None = None
    world_size: int | None = None
    rank_source: str | None = None
