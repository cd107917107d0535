"""Pure logic of death forensics: why a worker died, decided by the evidence it left.

Everything here takes plain data (the State API's rows as dicts, log lines,
the node agent's kernel-log / cgroup reading, the store's samples) and
returns plain values, so it is unit tested on saved texts without Ray.

A cause is only named with the evidence that decided it: a worker that
vanished without output and without an OOM record is "killed by SIGKILL"
together with what could *not* be read, never a guess.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from raysleuth.cluster.records import RayActor, RayDeathCause, RayTask, RayWorker
from raysleuth.deaths.causes import CAUSES, Cause
from raysleuth.deaths.parse import (
    LIBRARY_PATHS,
    FatalSignal,
    exit_code,
    init_exception,
    memory_monitor_report,
    parse_fatal,
)

__all__ = [
    "CAUSES",
    "Cause",
    "DeathCause",
    "DeathEvidence",
    "FatalSignal",
    "classify",
    "exit_code",
    "init_exception",
    "memory_monitor_report",
    "parse_fatal",
]

_VANISHED = re.compile(r"connection error code 2|End of file|unexpectedly exits with a connection error")


@dataclasses.dataclass(kw_only=True)
class DeathEvidence:
    """Everything collected about one dead worker; each field may be empty."""

    actor: RayActor | None = None
    """The State API's actor (with its death cause), or None for a task worker."""
    worker: RayWorker | None = None
    """The State API's worker (exit type, exit detail, end time)."""
    task: RayTask | None = None
    """The task or actor call it was running when it died (its error message)."""
    err_lines: list[str] = dataclasses.field(default_factory=list)
    out_lines: list[str] = dataclasses.field(default_factory=list)
    fatal_file: str | None = None
    """raysleuth's ``raysleuth-fatal-<pid>.log`` (zero-code setup), when present."""
    capsules: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Crash capsules of this worker: ``{"time", "exception_type", "message", "method"}``."""
    oom: dict[str, Any] | None = None
    """The node agent's reading: ``kernel_log`` {permitted, reason, kills}, ``cgroup`` {oom_kill, limit_bytes}."""
    memory_samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The worker's last memory samples, oldest first: ``{"time", "rss_bytes", "uss_bytes"...}``."""
    node_alive: bool | None = None
    log_problems: list[str] = dataclasses.field(default_factory=list)
    """Why a log could not be read."""

    def __post_init__(self) -> None:
        """A State API row given for ``actor``, ``worker`` or ``task`` becomes its record."""
        for name, record in (("actor", RayActor), ("worker", RayWorker), ("task", RayTask)):
            value = getattr(self, name)
            if isinstance(value, Mapping):
                setattr(self, name, record.from_state(value))


@dataclasses.dataclass(kw_only=True)
class DeathCause:
    """The classified cause and the evidence that decided it."""

    cause: Cause
    summary: str
    evidence: list[str]
    signal: str | None = None
    exit_code: int | None = None
    function: str | None = None
    file: str | None = None
    line: int | None = None
    stack: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    exception_type: str | None = None
    exception_message: str | None = None
    top_memory_users: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    caller: str | None = None
    ray_reason: str | None = None
    """Ray's own death reason (``WORKER_DIED``, ``RAY_KILL``...), for comparison."""


#: A kernel OOM kill counts for a death when logged this long before it, or up to ``KILL_AFTER_S`` after.
KILL_BEFORE_S = 60.0
KILL_AFTER_S = 15.0


def _expected_names(evidence: DeathEvidence) -> list[str]:
    """The command names (``comm``, 15 characters) the worker can have had: Ray titles it ``ray::<what>``."""
    names = []
    if evidence.actor is not None and evidence.actor.class_name:
        names.append(f"ray::{evidence.actor.class_name}")
    if evidence.task is not None and evidence.task.function:
        names.append(f"ray::{evidence.task.function}")
    return names


def _name_fits(name: str | None, expected: list[str]) -> bool:
    if not name or not expected or name.startswith("python") or name == "ray::IDLE":
        return True  # unknown, or a worker before Ray set its title
    return any(name.startswith(want) or want.startswith(name) for want in expected)


def _kernel_kill(evidence: DeathEvidence, pid: int | None) -> tuple[str | None, list[str]]:
    """The kernel log's kill of this process at this time: ``(line, [])``, else ``(None, why none counted)``.

    A kill counts when its pid, its time (``KILL_BEFORE_S`` before to
    ``KILL_AFTER_S`` after the death) and its command name fit. In another
    pid namespace (a container: dmesg prints host pids) the pid cannot
    decide: one kill whose name and time fit does, and the line says so.
    """
    kernel = (evidence.oom or {}).get("kernel_log") or {}
    kills = kernel.get("kills") or []
    same_namespace = (kernel.get("pid_namespace") or {}).get("same_as_kernel_log")
    died, expected = _died_at(evidence), _expected_names(evidence)
    notes: list[str] = []

    def in_time(kill: Mapping[str, Any]) -> bool:
        when = kill.get("time")
        return died is None or when is None or died - KILL_BEFORE_S <= when <= died + KILL_AFTER_S

    if same_namespace is False:
        fitting = [kill for kill in kills if in_time(kill) and expected and _name_fits(kill.get("name"), expected)
                   and str(kill.get("name", "")).startswith("ray::")]
        if len(fitting) == 1 and died is not None and fitting[0].get("time") is not None:
            return (f"{fitting[0].get('text')} (matched by command name and time: the kernel log's pids are "
                    "the host's)"), []
        notes.append("the kernel log uses another pid namespace (its pids are the host's), and "
                     + ("no single kill fits this worker's name and time" if kills else "it lists no OOM kill"))
        return None, notes
    for kill in kills:
        if pid is None or kill.get("pid") != pid:
            continue
        if not in_time(kill):
            notes.append(f"kernel log: pid {pid} was OOM-killed at {kill.get('time'):.0f}, not near this death "
                         f"at {died:.0f} (a reused pid)")
        elif not _name_fits(kill.get("name"), expected):
            notes.append(f"kernel log: pid {pid} was OOM-killed as {kill.get('name')!r}, not as this worker "
                         f"({', '.join(expected)})")
        else:
            line = kill.get("text") or f"Killed process {pid}"
            if died is None or kill.get("time") is None:
                line += " (time not compared: " + ("the death time is unknown)" if died is None
                                                   else "the kernel line has no time stamp)")
            return line, []
    return None, notes


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value / 2**30:.2f} GiB"


# ------------------------------------------------------------------ verdict


def classify(evidence: DeathEvidence) -> DeathCause:
    """The cause of one death, decided by the first rule whose evidence is present."""
    cause = evidence.actor.death if evidence.actor else RayDeathCause()
    reason = "OUT_OF_MEMORY" if cause.kind == "oom" else (cause.reason or None)
    worker, task = evidence.worker, evidence.task
    message = "\n".join(str(part) for part in (
        cause.error_message if cause.kind in ("died", "oom") else None, worker.exit_detail if worker else None,
        task.error_message if task else None,
    ) if part)
    pid = (evidence.actor.pid if evidence.actor else None) or (worker.pid if worker else None)

    # strongest evidence first: a kernel record of killing this very process at this time beats an
    # exception captured (and perhaps handled) up to CAPSULE_WINDOW_S before
    for rule in (_init_failed, _node_died, _kernel_oom, _memory_monitor, _fatal_signal, _python_exception, _ray_kill,
                 _exited, _vanished):
        verdict = rule(evidence, cause, reason, message, pid)
        if verdict is not None:
            verdict.ray_reason = reason or (worker.exit_type if worker else None)
            return verdict
    if reason == "OWNER_DIED":
        return DeathCause(cause="owner_died", summary=CAUSES["owner_died"], evidence=[f"Ray: {message[:300]}"],
                          ray_reason=reason)
    if reason == "REF_DELETED":
        return DeathCause(cause="out_of_scope", summary=CAUSES["out_of_scope"], evidence=[f"Ray: {message[:300]}"],
                          ray_reason=reason)
    said = f"Ray: {message.splitlines()[0][:300]}" if message else "Ray recorded no death cause"
    return DeathCause(cause="unknown", summary="no evidence decides the cause", evidence=[said] + evidence.log_problems,
                      ray_reason=reason)


def _init_failed(evidence, cause, reason, message, pid) -> DeathCause | None:
    task = evidence.task
    creation_failed = task is not None and (task.type == "ACTOR_CREATION_TASK" or str(task.name or "").endswith(
        ".__init__")) and task.error_type == "TASK_EXECUTION_EXCEPTION"
    recorded = cause.kind == "creation_failed"
    if not recorded and not creation_failed:
        return None
    formatted = ((cause.formatted_exception or cause.error_message if recorded else None)
                 or (task.error_message if task else None) or "")
    kind, text = init_exception(formatted)
    frames = [{"file": m.group(1), "line": int(m.group(2)), "function": m.group(3)}
              for m in re.finditer(r'File "([^"]+)", line (\d+), in (\S+)', formatted)
              if not any(part in m.group(1) for part in LIBRARY_PATHS)]
    where: dict[str, Any] = frames[-1] if frames else {}
    return DeathCause(cause="init_failed",
                      summary=f"its __init__ raised {kind or 'an exception'}" + (f": {text}" if text else ""),
                      evidence=["Ray recorded a creation task failure" + (" (creation_task_failure_context)" if recorded
                                                                            else f" (task {task.name} FAILED)")]
                      + ([f"{where['file']}:{where['line']} in {where['function']}"] if where else []),
                      exception_type=kind, exception_message=text, function=where.get("function"),
                      file=where.get("file"), line=where.get("line"), stack=frames, ray_reason="CREATION_TASK_ERROR")


def _node_died(evidence, cause, reason, message, pid) -> DeathCause | None:
    if reason == "NODE_DIED" or reason == "NODE_PREEMPTION":
        return DeathCause(cause="node_died", summary="its node died" + (" (preempted)" if reason == "NODE_PREEMPTION" else ""),
                          evidence=[f"Ray: {reason}: {message.splitlines()[0][:300] if message else ''}"])
    if evidence.node_alive is False and (reason in (None, "WORKER_DIED") or not cause.recorded):
        return DeathCause(cause="node_died", summary="its node died",
                          evidence=["the State API lists its node as DEAD"] + ([f"Ray: {message[:200]}"] if message else []))
    return None


def _memory_monitor(evidence, cause, reason, message, pid) -> DeathCause | None:
    if reason != "OUT_OF_MEMORY" and "running low on memory" not in message and "NODE_OUT_OF_MEMORY" not in message:
        return None
    report = memory_monitor_report(message)
    found = ["Ray: " + next((line.strip() for line in message.splitlines() if "low on memory" in line),
                            f"death reason {reason}")[:300]]
    reason_line = next((line.strip() for line in message.splitlines() if line.startswith("OOM kill reason")), None)
    if reason_line:
        found.append(f"Ray: {reason_line[:300]}")
    elif "node_used_gb" in report:
        found.append(f"node memory {report['node_used_gb']}GB used / {report['node_limit_gb']}GB limit")
    users = report["top_users"]
    if users:
        found.append("top memory users: " + ", ".join(f"pid {u['pid']} {u['memory_gb']}GB ({u['command'][:40]})"
                                                      for u in users[:3]))
    return DeathCause(cause="memory_monitor", summary="killed by Ray's memory monitor: the node ran low on memory",
                      evidence=found, signal="SIGKILL", top_memory_users=users)


def _fatal_signal(evidence, cause, reason, message, pid) -> DeathCause | None:
    fatal = parse_fatal("\n".join(evidence.err_lines))
    if fatal is None and evidence.fatal_file:
        fatal = parse_fatal(evidence.fatal_file, source="raysleuth fatal-signal file")
    if fatal is None:
        return None
    where = fatal.user_function or fatal.function
    summary = f"fatal signal {fatal.signal or ''} ({fatal.error})".replace("  ", " ")
    if where:
        summary += f" in {where}()"
    found = [f"{fatal.source}: Fatal Python error: {fatal.error}"]
    if fatal.frames:
        top = fatal.frames[0]
        found.append(f"innermost frame {top['file']}:{top['line']} in {top['function']}")
    return DeathCause(cause="fatal_signal", summary=summary, evidence=found, signal=fatal.signal,
                      function=where, file=fatal.user_file or fatal.file, line=fatal.user_line or fatal.line,
                      stack=fatal.frames)


#: A capsule older than this before the death is an earlier, handled exception, not the cause.
CAPSULE_WINDOW_S = 120.0


def _died_at(evidence: DeathEvidence) -> float | None:
    for row in (evidence.worker, evidence.task):
        value = row.end_time_ms if row is not None else None
        if value:
            return float(value) / 1000.0
    return None


def _recent_capsules(evidence: DeathEvidence) -> list[dict[str, Any]]:
    died = _died_at(evidence)
    return [capsule for capsule in evidence.capsules
            if died is None or capsule.get("time") is None or died - CAPSULE_WINDOW_S <= capsule["time"] <= died + 5]


def _kernel_oom(evidence, cause, reason, message, pid) -> DeathCause | None:
    line, _ = _kernel_kill(evidence, pid)
    if line is None:
        return None
    found = [f"kernel log: {line[:400]}"]
    if message:
        found.append(f"Ray: {message.splitlines()[0][:200]}")
    for capsule in _recent_capsules(evidence)[-1:]:
        found.append(f"before it, crash capsule {capsule.get('id', '')} recorded {capsule.get('exception_type')} "
                     "(an exception the worker outlived, not the cause)")
    return DeathCause(cause="oom_killer", summary="killed by the kernel OOM killer (SIGKILL)", signal="SIGKILL",
                      evidence=found)


def _python_exception(evidence, cause, reason, message, pid) -> DeathCause | None:
    capsules = _recent_capsules(evidence)
    if not capsules:
        return None
    capsule = capsules[-1]
    kind = capsule.get("exception_type") or "an exception"
    found = [f"crash capsule {capsule.get('id', '')} ({capsule.get('method') or 'worker'})".replace("  ", " ")]
    if message:
        found.append(f"then Ray: {message.splitlines()[0][:200]}")
    return DeathCause(cause="python_exception", summary=f"a Python exception: {kind}: {str(capsule.get('message', ''))[:200]}",
                      evidence=found,
                      exception_type=capsule.get("exception_type"), exception_message=capsule.get("message"),
                      function=capsule.get("method"))


def _ray_kill(evidence, cause, reason, message, pid) -> DeathCause | None:
    if reason != "RAY_KILL" and "killed by `ray.kill`" not in message:
        return None
    owner = cause.owner_ip
    caller = (f"owner {(cause.owner_id or '')[:16]} on {owner}" if owner else None)
    found = ["Ray: " + (message.splitlines()[0] if message else "RAY_KILL")[:300]]
    found.append("Ray does not record which process called ray.kill" + (f"; the actor's {caller}" if caller else ""))
    return DeathCause(cause="ray_kill", summary="killed with ray.kill", evidence=found, caller=caller)


def _exited(evidence, cause, reason, message, pid) -> DeathCause | None:
    if reason == "OWNER_DIED" or "because its owner has died" in message:
        return None  # the owner's exit type (INTENDED_USER_EXIT...) is not this worker's: owner_died decides
    code = exit_code(message)
    intended = "INTENDED_USER_EXIT" in message or "exit_actor" in message or "by an user request" in message
    if code is None and not intended:
        return None
    found = ["Ray: " + next((line.strip() for line in message.splitlines() if "exit" in line.lower()), "")[:300]]
    last = next((line for line in reversed(evidence.out_lines + evidence.err_lines) if line.strip()
                 and not line.startswith(":")), None)
    if last:
        found.append(f"last log line: {last.strip()[:200]}")
    if intended and code in (None, 0):
        return DeathCause(cause="exit", summary="it exited on purpose (exit_actor / an intended exit)", evidence=found,
                          exit_code=code)
    return DeathCause(cause="exit", summary=f"the process exited with code {code} (sys.exit({code}) or os._exit({code}))",
                      evidence=found, exit_code=code)


def _vanished(evidence, cause, reason, message, pid) -> DeathCause | None:
    if not _VANISHED.search(message) and reason != "WORKER_DIED":
        return None
    found = ["Ray: the worker's connection closed with no exit code (connection error code 2, End of file)",
             "no fatal-signal output in its log" if evidence.err_lines else "its error log could not be read"]
    kernel = (evidence.oom or {}).get("kernel_log") or {}
    cgroup = (evidence.oom or {}).get("cgroup") or {}
    _, kill_notes = _kernel_kill(evidence, pid)
    oom_kills = cgroup.get("oom_kill")
    limit = cgroup.get("limit_bytes")
    last = evidence.memory_samples[-1] if evidence.memory_samples else None
    rss = (last or {}).get("rss_bytes")
    near = bool(limit and rss and rss >= 0.9 * limit)
    # the kernel log rules an OOM kill out only when it was read and its pids are the workers' pids
    ruled_out = bool(kernel.get("permitted")) and (kernel.get("pid_namespace") or {}).get("same_as_kernel_log") \
        is not False
    if oom_kills and near and not ruled_out:
        return DeathCause(cause="oom_killer", summary="killed by the kernel OOM killer (SIGKILL)", signal="SIGKILL",
                          evidence=found + [f"cgroup {cgroup.get('path') or ''} counted {oom_kills} OOM kill(s)",
                                            f"its last memory sample {_gb(rss)} was ≥90% of the {_gb(limit)} limit"])
    found.extend(kill_notes)
    if kernel.get("permitted"):
        if not kill_notes:
            found.append("kernel log read: no OOM kill of this pid")
    elif kernel:
        found.append(f"no OOM record readable on this node (kernel log not permitted: {kernel.get('reason') or 'denied'})")
    else:
        found.append("no OOM record readable on this node (the node agent was not asked or did not answer)")
    if oom_kills:
        found.append(f"cgroup {cgroup.get('path') or ''} counted {oom_kills} OOM kill(s), not tied to this pid")
    elif cgroup:
        found.append(f"cgroup {cgroup.get('path') or ''}: oom_kill 0")
    if last:
        found.append(f"its last memory sample: rss {_gb(rss)}")
    return DeathCause(cause="sigkill", summary="killed by SIGKILL (not the kernel OOM killer as far as the node shows)"
                      if ruled_out else "killed by SIGKILL; the kernel OOM killer could not be ruled out",
                      evidence=found, signal="SIGKILL")
