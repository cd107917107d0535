"""The shape of a stack capture: ``StackReport`` → ``ProcessStack`` → ``ThreadStack`` → ``Frame``.

Capture apart from display: these dataclasses hold what py-spy saw and what
raysleuth concluded; the CLI draws them, ``--json`` is :meth:`StackReport.to_dict`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

__all__ = ["ACTIVITIES", "PROBLEM_STATES", "STATES", "Activity", "Consequence", "Culprit", "Frame", "Missing", "ProcessStack", "StackGroup",
           "StackReport", "StackVerdict", "ThreadStack", "VerdictState", "WaitEdge", "WaitLink"]

Activity = Literal["working", "active", "waiting", "blocked", "returned"]
"""What a process's key thread did over the capture window (:mod:`raysleuth.stacks.progress`)."""
ACTIVITIES: tuple[Activity, ...] = get_args(Activity)


@dataclasses.dataclass
class Frame:
    """One Python frame."""

    function: str
    file: str
    """Full path of the source file, as the process sees it."""
    line: int
    short_file: str = ""
    """Package-relative file name (``ray/_private/worker.py``, ``trainer.py``)."""

    @property
    def where(self) -> str:
        """``function (file:line)`` with the short file name."""
        return f"{self.function} ({self.short_file or self.file}:{self.line})"


@dataclasses.dataclass
class ThreadStack:
    """One thread of a process, innermost frame first."""

    name: str
    thread_id: int | None = None
    os_thread_id: int | None = None
    idle: bool = False
    """True when the thread was not running (blocked in a wait, a sleep, a syscall)."""
    owns_gil: bool = False
    role: str = "background"
    """``main`` (the main thread), ``task`` (a thread running a Ray task), ``training`` (a thread running
    the user's code: Ray Train's ``TrainingThread``, any thread with user frames) or ``background``."""
    frames: list[Frame] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ProcessStack:
    """One process: its labels, its threads, or the reason it could not be read."""

    pid: int
    node_ip: str | None = None
    node_id: str | None = None
    role: str = "worker"
    """``driver``, ``actor``, ``task``, ``idle worker`` or ``child`` (a subprocess of a worker)."""
    actor_class: str | None = None
    actor_name: str | None = None
    actor_id: str | None = None
    rank: int | None = None
    rank_source: str | None = None
    """Where the rank came from: ``registered``, ``ray train``, ``environment``, ``verl environment``,
    ``actor name``; None when no source knew it (``rank_note`` says why, when a source could not be read)."""
    world_size: int | None = None
    local_rank: int | None = None
    rank_note: str | None = None
    task_name: str | None = None
    """The Ray task or actor method it runs now (State API)."""
    task_id: str | None = None
    job_id: str | None = None
    parent_pid: int | None = None
    """For a child process: the Ray worker it belongs to."""
    title: str | None = None
    threads: list[ThreadStack] = dataclasses.field(default_factory=list)
    folded_threads: int = 0
    """Idle background threads left out (``include_idle`` shows them)."""
    error: str | None = None
    seconds: float | None = None
    """How long py-spy took on this process."""
    event_loop: bool = False
    """A thread runs an asyncio event loop (an async actor: its calls await off the main thread)."""
    event_loop_thread: int | None = None
    """The OS thread id of that event loop: an async actor's progress is measured on it."""
    samples: int | None = None
    """Samples it was measured over: 2 when both py-spy reads and the counters around them were read; 1 when
    its second read or its counters failed (it is judged as one sample); None before a read."""
    exited: bool = False
    """It exited between the two samples (its pid left ``/proc``): out of the verdict, which says so."""
    moved: bool | None = None
    """Between the two samples: True when the key thread's frames changed or it used CPU or woke; None with one sample."""
    moved_frames: bool | None = None
    """Between the two samples: True when the key thread's frames changed; None with one sample."""
    counters: dict[str, float] | None = None
    """The key thread's counters over the window (``/proc``, read by the node agent): ``cpu`` seconds,
    ``switches`` (voluntary context switches), ``preempted``, ``io`` bytes, ``window`` seconds, ``disk_wait`` (at
    how many of the two reads it was in the kernel's wait on a device, state ``D``)."""
    progress: list[str] = dataclasses.field(default_factory=list)
    """The signals that decided ``activity``: ``heartbeat step 4 → 6``, ``collectives 120 → 180``,
    ``Ray call finished``, ``stack moved between the samples``, ``cpu 0.40s in 2.0s``, ``woke 40 times in 2.0s``."""
    group: str | None = None
    """Its peer group: one role in one group of one job (``job 01000000 / verl group abcdefWorkerDict``)."""
    coroutines: list[dict[str, Any]] | None = None
    """Pending asyncio tasks (processes with raysleuth inside): ``task``, ``frames``, ``awaits``, ``waited_s``."""
    activity: Activity | None = None
    """``working`` (progress seen), ``active`` (CPU or wake-ups at the same frames, no counter moved),
    ``waiting`` (no progress, blocked in a collective, ``ray.get`` or an awaited call), ``blocked`` (no
    progress, elsewhere), ``returned`` (idle in Ray's task loop), or None (no stack):
    :mod:`raysleuth.stacks.progress`."""
    wait: str | None = None
    """What it waits in, when ``waiting``: ``all_reduce (torch.distributed)``, ``ray.get``."""

    @property
    def label(self) -> str:
        """A short human name: ``rank 3 Trainer pid 1234 @ 10.0.0.2``."""
        parts = []
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        parts.append(self.actor_class or self.role)
        parts.append(f"pid {self.pid}")
        if self.node_ip:
            parts.append(f"@ {self.node_ip}")
        return " ".join(parts)


@dataclasses.dataclass
class StackGroup:
    """Processes whose key threads show the same frames."""

    count: int
    pids: list[int]
    ranks: list[int]
    frames: list[Frame]
    headline: str
    """``waiting in all_reduce (trainer.py:88) → get``."""
    idle: bool = False
    actor_classes: list[str] = dataclasses.field(default_factory=list)
    members: list[tuple[str | None, int]] = dataclasses.field(default_factory=list)
    """``(node_ip, pid)`` of every member (pids repeat across nodes)."""


@dataclasses.dataclass
class Culprit:
    """A process the verdict blames, and why."""

    pid: int
    node_ip: str | None
    rank: int | None
    reason: str
    actor_class: str | None = None
    actor_name: str | None = None
    function: str | None = None
    file: str | None = None
    line: int | None = None
    rule: str = ""
    """The evidence that named it: ``collective positions``, ``deadlock``, ``peers`` (the ones its
    collective waits for), ``wait-for chain`` (the sink of Ray calls), ``coroutine``, ``dead peer``,
    ``call not returned``, or an extra rule's name."""
    rank_source: str | None = None
    evidence: str | None = None
    """The clue itself, in a line (the peers' wait, the death cause, the call that did not return)."""


@dataclasses.dataclass
class WaitLink:
    """One step of a wait-for chain: a process and the call it is executing."""

    pid: int
    node_ip: str | None
    role: str
    actor_class: str | None = None
    rank: int | None = None
    task_name: str | None = None
    where: str | None = None
    """Where its key thread is (``waiting in forward (a.py:9) → get``)."""
    waiting: bool = False
    """True when it is blocked in ``ray.get``/``ray.wait`` on the next link."""


@dataclasses.dataclass
class WaitEdge:
    """One "A waits for B" of the wait-for graph (:mod:`raysleuth.stacks.graph`)."""

    source: str
    target: str
    kind: str
    """``ray call``, ``queued call`` (behind a busy actor's running call), ``collective``, ``await``
    (a coroutine), ``call not returned`` (a verl / pool call) or ``dead peer``."""
    evidence: str = ""


@dataclasses.dataclass
class Consequence:
    """A process whose state the root cause explains, and the edge that ties it to it."""

    who: str
    """``rank 2 DDPRank pid 4242 @ 10.0.0.2``."""
    state: str
    """Its activity (``waiting``, ``blocked``, ``returned``, ``dead``...)."""
    because: str
    """``waits for rank 1 in all_reduce (torch.distributed)``."""
    pid: int | None = None
    node_ip: str | None = None
    rank: int | None = None


VerdictState = Literal["ok", "busy", "culprit", "deadlock", "hung", "unsure", "unread"]
"""The stacks verdict's state (DESIGN.md "Honest states"): exit 0 for ``ok``/``busy``, 1 for ``culprit``/
``deadlock``/``hung``, 2 for ``unsure``/``unread``."""
STATES: tuple[VerdictState, ...] = get_args(VerdictState)
PROBLEM_STATES: tuple[VerdictState, ...] = ("culprit", "deadlock", "hung")


@dataclasses.dataclass
class StackVerdict:
    """The root cause (or causes), what it explains, the wait-for graph, and a one-line summary."""

    culprits: list[Culprit] = dataclasses.field(default_factory=list)
    """The root causes: one, or several only when the evidence shows they are independent; every
    member of a cycle for ``deadlock``."""
    summary: str = ""
    chains: list[list[WaitLink]] = dataclasses.field(default_factory=list)
    state: VerdictState = "ok"
    """``culprit`` (a root cause is named), ``deadlock`` (a wait-for cycle, every member named), ``hung``
    (no progress, no root cause found), ``busy`` (progress seen), ``ok`` (an idle job: nothing runs,
    nothing waits), ``unsure`` (progress could not be measured: one sample, or no counters), ``unread``
    (no process could be read)."""
    samples: int = 1
    notes: list[str] = dataclasses.field(default_factory=list)
    next_command: str | None = None
    """What to run next when the job is hung or a culprit is named."""
    consequences: list[Consequence] = dataclasses.field(default_factory=list)
    edges: list[WaitEdge] = dataclasses.field(default_factory=list)
    signals: list[str] = dataclasses.field(default_factory=list)
    """Which signals decided the state (``collectives advanced on 3 ranks``, ``no CPU, no wake-ups``)."""

    @property
    def problem(self) -> bool:
        """True when the verdict found something wrong (exit code 1)."""
        return bool(self.culprits) or self.state in PROBLEM_STATES

    @property
    def exit_code(self) -> int:
        """0: progress seen or an idle job; 1: a culprit, a deadlock or a hang; 2: nothing read or unsure."""
        if self.problem:
            return 1
        return 2 if self.state in ("unread", "unsure") else 0


@dataclasses.dataclass
class Missing:
    """Something the report could not include, and why."""

    reason: str
    node_ip: str | None = None
    pid: int | None = None


@dataclasses.dataclass
class StackReport:
    """Cluster-wide stacks: every process, the groups, the verdict, what is missing."""

    processes: list[ProcessStack] = dataclasses.field(default_factory=list)
    groups: list[StackGroup] = dataclasses.field(default_factory=list)
    verdict: StackVerdict = dataclasses.field(default_factory=StackVerdict)
    missing: list[Missing] = dataclasses.field(default_factory=list)
    captured_at: float = 0.0
    seconds: float = 0.0
    native: bool = False
    include_idle: bool = False
    nodes: int = 0
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds spent discovering processes, running py-spy (each sample), waiting between samples, analysing."""
    samples: int = 1
    interval: float = 0.0
    """Seconds between the two samples (0 with one)."""

    @property
    def partial(self) -> bool:
        """True when a node or a process could not be read."""
        return bool(self.missing)

    def process(self, pid: int, node_ip: str | None = None) -> ProcessStack | None:
        """The process with this pid (and node ip, when pids repeat)."""
        for proc in self.processes:
            if proc.pid == pid and (node_ip is None or proc.node_ip == node_ip):
                return proc
        return None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict."""
        data = dataclasses.asdict(self)
        data["partial"] = self.partial
        data["problem"] = self.verdict.problem
        return data
