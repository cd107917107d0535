"""Kinds that store a feature's whole report: ``doctor``, ``stack_report``, ``tasks``, ``straggler``, ``collectives``.

Their nested layouts belong to the feature that writes them (``StackReport.to_dict()`` and the rest);
the fields a reader lays out are typed here, the rest stays in :attr:`~raysleuth.evidence.Evidence.raw`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth.evidence.base import Evidence, Part

__all__ = ["Collectives", "Culprit", "DoctorCheck", "DoctorRun", "StackFrame", "StackGroup", "StackRun", "StackVerdict", "StragglerRun",
           "TaskItem", "TasksRun"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DoctorCheck(Part):
    """One check of ``raysleuth doctor``."""

    status: str = "?"
    name: str = "?"
    node: str | None = None
    detail: str | None = None
    fix: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DoctorRun(Evidence):
    """A stored ``DoctorReport.to_dict()``."""

    KIND = "doctor"
    WRITTEN_BY = "`doctor.run_doctor`"
    NAMED = "`doctor`"

    ok: bool = True
    counts: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float | None = None
    cluster: Any = None
    checks: tuple[DoctorCheck, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class StackFrame(Part):
    """One frame of a stack group (outermost first)."""

    function: str | None = None
    file: str | None = None
    line: int | None = None
    short_file: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Culprit(Part):
    """A root cause the stacks verdict names."""

    pid: int | None = None
    node_ip: str | None = None
    rank: int | None = None
    reason: str = ""
    actor_class: str | None = None
    actor_name: str | None = None
    function: str | None = None
    file: str | None = None
    line: int | None = None
    rule: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StackGroup(Part):
    """Processes that share one stack."""

    count: int | None = None
    pids: tuple[Any, ...] = ()
    ranks: tuple[Any, ...] = ()
    members: tuple[Any, ...] = ()
    frames: tuple[StackFrame | str, ...] = ()
    headline: str | None = None
    idle: bool | None = None
    actor_classes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class StackVerdict(Part):
    """The verdict of a stack report: root causes (``culprits``), consequences, state."""

    culprits: tuple[Culprit, ...] = ()
    summary: str = ""
    state: str | None = None
    consequences: tuple[dict[str, Any], ...] = ()
    edges: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    next_command: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StackRun(Evidence):
    """A stored ``StackReport.to_dict()`` (processes with their threads and frames, groups, verdict)."""

    KIND = "stack_report"
    WRITTEN_BY = ("`raysleuth stacks` (unless `--no-record`), the stall watchdog (`rs.watchdog`, `raysleuth "
                  "watch`); level `ERROR` when a culprit is named or the job is hung, else `INFO`")
    NAMED = "`stacks` (CLI) or `watch` (watchdog snapshot)"
    NOTE = "`processes` as `ProcessStack.to_dict()` (threads, frames, counters, activity); see `stacks/`"

    processes: tuple[dict[str, Any], ...] = ()
    groups: tuple[StackGroup, ...] = ()
    verdict: StackVerdict = dataclasses.field(default_factory=StackVerdict)
    missing: tuple[Any, ...] = ()
    partial: bool | None = None
    problem: bool | None = None
    captured_at: float | None = None
    seconds: float | None = None
    samples: int | None = None
    interval: float | None = None
    native: bool | None = None
    include_idle: bool | None = None
    nodes: Any = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskItem(Part):
    """One pending, stuck or failed task of a task report."""

    task_id: str | None = None
    name: str | None = None
    state: str | None = None
    reason: str | None = None
    detail: str | None = None
    type: str | None = None
    required_resources: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TasksRun(Evidence):
    """A stored ``TaskReport.to_dict()``."""

    KIND = "tasks"
    WRITTEN_BY = ("`raysleuth demo` (`pending` scenario: what `tasks.find_tasks` said); level `WARNING` when it "
                  "found a problem. The report reads it for its Tasks section")
    NAMED = "`tasks --pending`"

    pending: tuple[TaskItem, ...] = ()
    stuck: tuple[dict[str, Any], ...] = ()
    failed: tuple[dict[str, Any], ...] = ()
    dead_actors: tuple[dict[str, Any], ...] = ()
    problem: bool | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class WaitSite(Part):
    """Where a straggler's peers spend the time it is slow (``stragglers[].phase.peers_wait``)."""

    function: str | None = None
    file: str | None = None
    line: int | None = None
    share: float | None = None
    straggler_share: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlowPhasePart(Part):
    """A named straggler's slow phase, as sampled (``stragglers[].phase``)."""

    function: str | None = None
    file: str | None = None
    line: int | None = None
    share: float | None = None
    peer_share: float | None = None
    stack: tuple[str, ...] = ()
    thread: str | None = None
    samples: int | None = None
    peer_samples: int | None = None
    peers_wait: WaitSite | None = None
    lead: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class NamedStraggler(Part):
    """One rank a stored straggler report named (``stragglers[]``)."""

    rank: int | None = None
    median_lateness_s: float | None = None
    share_of_step: float | None = None
    late_share: float | None = None
    collectives: int | None = None
    cost_s: float | None = None
    cost_share: float | None = None
    wait_site: Any = None
    phase: SlowPhasePart | None = None
    node: str | None = None
    pid: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StragglerRun(Evidence):
    """A stored ``StragglerReport.to_dict()``: which rank entered collectives late, by how much."""

    KIND = "straggler"
    WRITTEN_BY = ("`raysleuth watch --slow` (`stragglers.SlowWatch`), once per newly named straggler; written by "
                  "the CLI's process (the judged job is `data.job_id`); level `WARNING`")
    NAMED = "`rank N` (the named ranks, comma-separated)"

    state: str = "unread"
    summary: str = ""
    ranks: tuple[dict[str, Any], ...] = ()
    stragglers: tuple[NamedStraggler, ...] = ()
    collectives: int | None = None
    threshold: float | None = None
    min_collectives: int | None = None
    min_share: float | None = None
    step_s: float | None = None
    window_s: float | None = None
    source: str | None = None
    one_offs: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    missing: tuple[Any, ...] = ()
    run: str | None = None
    job_id: str | None = None
    live: bool | None = None
    sampling: dict[str, Any] | None = None
    next_command: str | None = None
    exit_code: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Collectives(Evidence):
    """A worker's collective positions. Version 1 (before 8796202) dumps were never deltas."""

    KIND = "collectives"
    VERSION = 2
    WRITTEN_BY = ("`raysleuth.collectives` in a worker (`install()` as Ray's `worker_process_setup_hook`): on the "
                  "control key `collectives.dump` (`raysleuth collectives`), at exit, every second in full mode "
                  "when positions changed, once when the process group exists (`joined`)")
    NAMED = "the reason (`request`, `periodic`, `exit`, `joined`)"
    NOTE = ("`calls`: the wrapper's newest ≤64 per group (`collectives.model.ENTRIES_PER_GROUP`, what readers read; "
            "a request's `limit` asks for more, `collectives.model.entries_asked`: `stragglers` asks 256); "
            "`flight_recorder`: torch's JSON or null; `delta` (periodic): only what is new or changed since the previous periodic dump, plus the newest 8 per group; `detail`: "
            "whether each call has its file:line and shapes (full mode, or the control key `collectives.detail`); "
            "light mode, the default, keeps pg, seq, op, state, start_ns, end_ns and step per call, and file:line "
            "only for a call still running at the dump (from its caller's live stack)")

    reason: str | None = None
    request: dict[str, Any] | None = None
    time: float | None = None
    pid: int | None = None
    rank: int | None = None
    world_size: int | None = None
    job_id: str | None = None
    progress: int | None = None
    groups: dict[str, Any] = dataclasses.field(default_factory=dict)
    calls: tuple[dict[str, Any], ...] = ()
    flight_recorder: dict[str, Any] | None = None
    delta: bool = False
    detail: bool | None = None

    @classmethod
    def version_of(cls, data: dict[str, Any]) -> int:
        """1 for a dump stored before periodic dumps were deltas."""
        return 2 if "delta" in data else 1
