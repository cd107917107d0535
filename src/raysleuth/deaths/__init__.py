"""Why did rank N die? Death forensics for every worker that vanished.

:func:`find_deaths` reads what each dead actor and each worker that died
running a task left behind (:mod:`raysleuth.deaths.collect`), decides the
cause with the evidence that decided it (:mod:`raysleuth.deaths.classify`,
pure logic), and adds the rank (:func:`raysleuth.labels.dead_worker_labels`),
the last memory samples, the last lines of its stdout/stderr and where its
peers were. :func:`record_deaths` keeps them in the run's evidence store
(kind ``death``) so ``raysleuth crashes`` and the report show them after the
cluster is gone; :func:`stored_deaths` reads them back.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from raysleuth import cluster, evidence
from raysleuth.deaths.classify import CAUSES, DeathCause, DeathEvidence, classify
from raysleuth.deaths.parse import fatal_file_rank
from raysleuth.explain import explain, mentioned_workers

__all__ = ["CAUSES", "Death", "DeathReport", "FIXES", "build_death", "consequences", "deaths_named_in",
           "find_deaths", "record_deaths", "root_first", "stored_deaths"]

#: What to do about each cause.
FIXES = {
    "python_exception": "read the capsule (`raysleuth crashes show ID`) and fix the exception",
    "fatal_signal": "the native code under that Python function crashed: check its inputs (pointers, shapes, "
                    "library versions); run it alone with `python -X faulthandler`",
    "oom_killer": "the kernel ran out of memory: lower the worker's batch or model size, or give the node more "
                  "memory; `raysleuth memory` shows which rank grew",
    "sigkill": "something outside the job sent SIGKILL (kill -9, `ray stop --force`, a scheduler/supervisor, or "
               "an OOM kill the node could not show): check the node's kernel log (`dmesg`) and who manages it",
    "memory_monitor": "the node ran low on memory and Ray killed the newest task: reduce memory per worker, "
                      "request more CPUs per task, or raise RAY_memory_usage_threshold",
    "ray_kill": "something called ray.kill on it (a controller tearing the group down, or user code): "
                "look for the caller in the driver's logs",
    "exit": "the worker code called sys.exit/os._exit: read its last log lines for why",
    "node_died": "its node is gone: check the node's raylet logs and the machine (preemption, hardware, OOM)",
    "init_failed": "its __init__ raised: fix the exception shown (missing file, bad config, import error)",
    "owner_died": "the process that created it died first: find that death",
    "out_of_scope": "its handles were dropped: keep a reference, or make it detached",
    "unknown": "read its logs: `raysleuth logs` or `ray logs worker-*.err` on its node",
}


@dataclasses.dataclass(kw_only=True)
class Death(DeathCause):
    """One dead worker: who (rank), why (the classified :class:`DeathCause`: cause + evidence), and its last moments."""

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
    """The call it was running when it died, when Ray recorded one."""
    died_at: float | None = None
    last_stdout: list[str] = dataclasses.field(default_factory=list)
    last_stderr: list[str] = dataclasses.field(default_factory=list)
    memory_samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    peers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Other ranks' last step from the store, and whether they beat again after this death."""
    fix: str | None = None
    record_id: int | None = None
    """Its id in the evidence store, once recorded (``raysleuth crashes show ID``)."""

    @property
    def who(self) -> str:
        """``rank 3 (Worker, pid 123)`` style label."""
        rank = f"rank {self.rank}" if self.rank is not None else "rank ?"
        what = self.actor_name or self.actor_class or "task worker"
        return f"{rank} ({what}, pid {self.pid or '?'})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(kw_only=True)
class DeathReport:
    """Every death found, with what could not be read."""

    deaths: list[Death] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    log_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)


def _tail(lines: list[str], count: int) -> list[str]:
    kept = [line for line in lines if line.strip() and not line.startswith((":job_id:", ":actor_name:", ":task_name:"))]
    return kept[-count:]


def _died_at(subject: dict[str, Any]) -> float | None:
    for row in (subject.get("worker"), subject.get("task")):
        value = row.end_time_ms if row is not None else None
        if value:
            return float(value) / 1000.0
    return None


def _peers(rank: int | None, died_at: float | None, beats: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    if not beats:
        return []
    result = []
    for peer, beat in sorted(beats.items()):
        entry = {"rank": peer, "step": beat.get("step"), "last_beat": beat.get("time"), "self": peer == rank}
        if died_at is not None and peer != rank:
            entry["beat_after_death"] = (beat.get("time") or 0) > died_at
        result.append(entry)
    return result


def build_death(subject: dict[str, Any], evidence: DeathEvidence, verdict: DeathCause, label: dict[str, Any],
                beats: dict[int, dict[str, Any]], *, lines: int = 10) -> Death:
    """Join identity, verdict and context into one :class:`Death`."""
    actor, task = subject.get("actor"), subject.get("task")
    died_at = _died_at(subject)
    if label.get("rank") is None and fatal_file_rank(evidence.fatal_file) is not None:
        label = {**label, "rank": fatal_file_rank(evidence.fatal_file), "rank_source": "fatal-signal file"}
    classified = {field.name: getattr(verdict, field.name) for field in dataclasses.fields(DeathCause)}
    classified.update(stack=verdict.stack[:30], top_memory_users=verdict.top_memory_users[:10])
    return Death(
        **classified, rank=label.get("rank"),
        rank_source=label.get("rank_source"), world_size=label.get("world_size"), actor_id=subject.get("actor_id"),
        actor_class=((actor.class_name if actor else None) or "").rsplit(".", 1)[-1] or None,
        actor_name=(actor.name if actor else None) or None,
        pid=subject.get("pid"), node_id=subject.get("node_id"), node_ip=subject.get("node_ip"),
        task=(task.name or task.function) if task else None, died_at=died_at,
        last_stdout=_tail(evidence.out_lines, lines), last_stderr=_tail(evidence.err_lines, lines),
        memory_samples=evidence.memory_samples[-5:], peers=_peers(label.get("rank"), died_at, beats),
        fix=FIXES.get(verdict.cause),
    )


def find_deaths(address: str | None = None, *, job_id: str | None = None, lines: int = 10, parallel: int = 16,
                oom: bool = True, timeout: float = 30.0) -> DeathReport:
    """Every dead actor and task worker of the cluster, each with rank, classified cause and evidence.

    ``lines``: last stdout/stderr lines kept per worker. ``parallel``: logs
    read at once. ``oom``: ask node agents for kernel-log / cgroup OOM records
    when a worker vanished without output.
    """
    # `raysleuth explain --advise` loads this package for its causes (advise imports deaths.classify).
    # lazy: the collector, node agents and recorder load only when deaths are looked for
    from raysleuth.deaths.collect import gather
    from raysleuth.labels.dead import dead_worker_labels

    started = time.monotonic()
    cluster.connect(address)
    subjects, evidence, store, warnings = gather(job_id=job_id, parallel=parallel, oom=oom, timeout=timeout)
    actors = [subject["actor"] for subject in subjects if subject["actor"]]
    try:
        labels = dead_worker_labels(actors)
    except Exception as error:
        labels = {}
        warnings.append(f"ranks of dead actors not resolved: {error}")
    report = DeathReport(warnings=warnings, log_seconds=store.get("log_seconds", 0.0))
    for subject, found in zip(subjects, evidence):
        label = labels.get(subject["actor_id"]) or {}
        report.deaths.append(build_death(subject, found, classify(found), label, store.get("beats", {}), lines=lines))
    report.deaths.sort(key=lambda death: (death.died_at or 0, death.rank if death.rank is not None else 1 << 30))
    report.seconds = time.monotonic() - started
    return report


def _key(actor_id: str | None, node: str | None, pid: int | None) -> str:
    return actor_id or f"{node}:{pid}"


def _recorded_keys() -> set[str]:
    try:
        # lazy: the recorder loads only when deaths are read (see find_deaths)
        from raysleuth.recorder import open_store

        store = open_store()
    except Exception:
        return set()
    try:
        return {_key(record.actor_id, record.node_id, record.pid) for record in store.query("death")}
    except Exception:
        return set()
    finally:
        store.close()


def record_deaths(report: DeathReport) -> int:
    """Store each death as a ``death`` record with the dead worker's identity, once per worker. Never raises.

    Written without a client id: the writer's client registry (live ranks by pid) must not learn the
    pids of dead processes, which the OS may give to new ones.
    """
    try:
        import ray

        # lazy: the recorder loads only when deaths are stored (see find_deaths)
        from raysleuth.recorder import get_writer

        writer = get_writer()
        known = _recorded_keys()
        refs = []
        for death in report.deaths:
            if _key(death.actor_id, death.node_id, death.pid) in known:
                continue
            header = {"client_id": None,
                      "node_id": death.node_id, "node_ip": death.node_ip, "pid": death.pid,
                      "actor_id": death.actor_id, "actor_name": death.actor_name, "actor_class": death.actor_class,
                      "world_size": death.world_size}
            row = ("death", death.died_at or time.time(), death.rank, None, None, death.cause, "ERROR",
                   death.to_dict(), None)
            refs.append(writer.write.remote(header, [row]))
        return sum(ray.get(refs, timeout=30)) if refs else 0
    except Exception:
        return 0


def stored_deaths(run: str | None = None, *, home: Any = None, rank: int | list[int] | None = None) -> list[Death]:
    """The deaths recorded in a run's store (default: the latest), oldest first."""
    # lazy: the recorder loads only when deaths are read (see find_deaths)
    from raysleuth.recorder import open_store

    store = open_store(run, home=home)
    try:
        records = evidence.read(store, evidence.Death, rank=rank)
    finally:
        store.close()
    fields = {field.name for field in dataclasses.fields(Death)}
    return [Death(**{**{key: value for key, value in record.to_data().items() if key in fields and key in record.raw},
                     "record_id": record.row.id}) for record in records]


#: Causes that follow another death (the owner's, the job's end): never the root of a peer's error.
_FOLLOWING = ("owner_died", "out_of_scope")
#: What a rank says when a peer of its process group is gone (knowledge-base ids).
PEER_GONE = ("gloo-peer-died", "nccl-peer-died")


def root_first(deaths: list[Death]) -> list[Death]:
    """Deaths with a cause of their own first (oldest first), then those that followed another (owner died)."""
    return sorted(deaths, key=lambda death: (death.cause in _FOLLOWING, death.died_at or 0.0,
                                             death.rank if death.rank is not None else 1 << 30))


def consequences(deaths: list[Death], errors: list[tuple[Any, int | None, float | None, str]],
                 *, slack_s: float = 5.0) -> dict[Any, Death]:
    """Which errors are consequences of a peer's death (pure): ``{error key: the death that caused it}``.

    ``errors``: ``(key, rank, time, message)``, e.g. a crash capsule's id, rank, time and message. An error
    whose text says a peer is gone (gloo's "Connection closed/reset by peer", NCCL's "remote process
    exited") is tied to the earliest death of another rank with a cause of its own that happened before it
    (``slack_s`` allows for clocks and Ray's late death times).
    """
    roots = [death for death in root_first(deaths) if death.cause not in _FOLLOWING]
    result: dict[Any, Death] = {}
    if not roots:
        return result
    for key, rank, moment, message in errors:
        if not any(match.id in PEER_GONE for match in explain(message or "")):
            continue
        for death in roots:
            if death.rank is not None and death.rank == rank:
                continue
            if moment is not None and death.died_at is not None and death.died_at > moment + slack_s:
                continue
            result[key] = death
            break
    return result


def deaths_named_in(text: str, run: str | None = None, *, home: Any = None) -> list[Death]:
    """The recorded deaths of the workers an error text names (by actor id, else pid); [] without a store."""
    named = mentioned_workers(text)
    if not named["actor_ids"] and not named["pids"]:
        return []
    try:
        deaths = stored_deaths(run, home=home)
    except Exception:
        return []
    by_actor = [death for death in deaths if death.actor_id and death.actor_id in named["actor_ids"]]
    if by_actor:
        return by_actor
    return [death for death in deaths if death.pid in named["pids"]]
