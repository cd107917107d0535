"""The shape of a stack capture: ``StackReport`` → ``ProcessStack`` → ``ThreadStack`` → ``Frame``.

Capture apart from display: these dataclasses hold what py-spy saw and what
raysleuth concluded; the CLI draws them, ``--json`` is :meth:`StackReport.to_dict`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Culprit", "Frame", "Missing", "ProcessStack", "StackGroup", "StackReport", "ThreadStack", "Verdict",
           "WaitLink"]


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
    moved: bool | None = None
    """Between the two samples: True when the key thread's frames changed or it ran on CPU; None with one sample."""
    activity: str | None = None
    """``working`` (on CPU, or its stack moved), ``waiting`` (blocked in a collective or ``ray.get``),
    ``blocked`` (idle elsewhere, not moving), ``returned`` (idle in Ray's task loop), or None (no stack)."""
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
    """The rule that named it: ``peers``, ``wait-for chain``, ``dead peer``, ``call not returned``,
    or an extra rule's name (``collective position``)."""
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
class Verdict:
    """Who is to blame, the wait-for chains, and a one-line summary."""

    culprits: list[Culprit] = dataclasses.field(default_factory=list)
    summary: str = ""
    chains: list[list[WaitLink]] = dataclasses.field(default_factory=list)
    state: str = "ok"
    """``culprit`` (someone is named), ``hung`` (every rank waits, none stands apart), ``busy`` (ranks work),
    ``ok`` (nothing waits), ``unread`` (no process could be read)."""
    samples: int = 1
    notes: list[str] = dataclasses.field(default_factory=list)
    next_command: str | None = None
    """What to run next when the job is hung or a culprit is named."""

    @property
    def problem(self) -> bool:
        """True when the verdict found something wrong (exit code 1)."""
        return bool(self.culprits) or self.state == "hung"


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
    verdict: Verdict = dataclasses.field(default_factory=Verdict)
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
