"""Per-worker memory from the evidence store, and sampling workers from outside.

:func:`memory_report` reads the ``memory`` records of a run, groups them per
worker (node ip, pid), and gives each worker its latest sample, peak, trend
and leak verdict (:func:`raysleuth.memory.trend.detect_leak`).

:func:`sample_workers` samples every Ray worker process of the cluster
through the node agents (psutil on each node; no code change in the
worker) and stores the samples *with the sampled worker's identity*: the
rows go to the writer actor with a batch header that names the worker's
pid, node and actor, and the row's rank column comes from
:func:`raysleuth.labels.worker_labels`. So an agent sample reads back like
one the worker recorded itself, except ``data.source == "agent"`` (``data``
also repeats ``pid`` and ``node_ip``). Such rows carry no client id: they
do not register the CLI as a client of the run.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from raysleuth.memory.trend import LeakPolicy, LeakVerdict, detect_leak

__all__ = ["MemoryReport", "SampleRun", "WorkerMemory", "memory_report", "sample_workers", "sparkline"]

#: Sources whose samples are periodic and feed the trend.
TREND_SOURCES = ("watch", "agent")
#: Actor classes that are raysleuth's own machinery, never sampled.
OWN_ACTORS = ("NodeAgent", "EvidenceWriter")
_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], width: int = 30) -> str:
    """A one-line chart of ``values`` (thinned to ``width`` characters)."""
    points = [v for v in values if v is not None]
    if not points:
        return ""
    if len(points) > width:
        points = [points[round(i * (len(points) - 1) / (width - 1))] for i in range(width)]
    low, high = min(points), max(points)
    if high == low:
        return _BARS[0] * len(points)
    return "".join(_BARS[round((v - low) / (high - low) * (len(_BARS) - 1))] for v in points)


@dataclasses.dataclass
class WorkerMemory:
    """One worker's memory over the run: now, peak, trend, verdict."""

    rank: int | None
    pid: int | None
    node_ip: str | None
    node_id: str | None = None
    actor_class: str | None = None
    actor_name: str | None = None
    source: str | None = None
    """``watch`` (the worker sampled itself) or ``agent`` (sampled from outside)."""
    samples: int = 0
    first_time: float | None = None
    last_time: float | None = None
    rss_bytes: int | None = None
    """Latest RSS."""
    uss_bytes: int | None = None
    """Latest USS (private bytes; excludes Ray's shared object store pages)."""
    cuda_allocated_bytes: int | None = None
    cuda_reserved_bytes: int | None = None
    peak_bytes: int | None = None
    """Highest RSS seen."""
    cuda_peak_bytes: int | None = None
    slope_bytes_per_s: float | None = None
    slope_bytes_per_step: float | None = None
    leak: bool = False
    reason: str = ""
    status: str = "not enough data"
    """``leak``, ``ok`` or ``not enough data`` (never "ok" when too little was sampled)."""
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The verdict of the metric that decided (:class:`LeakVerdict` as a dict)."""
    series: list[float] = dataclasses.field(default_factory=list)
    """The verdict's metric, thinned to at most 60 points (for charts)."""


@dataclasses.dataclass
class MemoryReport:
    """Every worker's memory in one run."""

    store: str
    workers: list[WorkerMemory]

    @property
    def leaks(self) -> list[WorkerMemory]:
        """Workers whose verdict is a leak."""
        return [worker for worker in self.workers if worker.leak]

    @property
    def undecided(self) -> list[WorkerMemory]:
        """Workers with too few samples to judge ("not enough data")."""
        return [worker for worker in self.workers if worker.status == "not enough data"]

    def to_dict(self) -> dict[str, Any]:
        """``{"store", "workers": [...], "leaks": n}`` (JSON-ready)."""
        return {"store": self.store, "workers": [dataclasses.asdict(w) for w in self.workers], "leaks": len(self.leaks),
                "not_enough_data": len(self.undecided)}


def _thin(values: list[float], width: int = 60) -> list[float]:
    if len(values) <= width:
        return values
    return [values[round(i * (len(values) - 1) / (width - 1))] for i in range(width)]


def summarise(records: list, policy: LeakPolicy | None = None) -> WorkerMemory:
    """One worker's :class:`WorkerMemory` from its ``memory`` records (one source, time order)."""
    last = records[-1]
    data = [r.data for r in records]
    rank = next((r.rank for r in reversed(records) if r.rank is not None), None)
    times = [r.time for r in records]
    steps = [r.step for r in records]
    worker = WorkerMemory(
        rank=rank, pid=last.data.get("pid", last.pid), node_ip=last.data.get("node_ip", last.node_ip),
        node_id=last.node_id, actor_class=last.actor_class, actor_name=last.actor_name,
        source=last.data.get("source"), samples=len(records), first_time=times[0], last_time=times[-1],
        rss_bytes=last.data.get("rss_bytes"), uss_bytes=last.data.get("uss_bytes"),
        cuda_allocated_bytes=last.data.get("cuda_allocated_bytes"),
        cuda_reserved_bytes=last.data.get("cuda_reserved_bytes"),
    )
    rss = [d.get("rss_bytes") for d in data if d.get("rss_bytes") is not None]
    worker.peak_bytes = max(rss) if rss else None
    cuda_peaks = [d.get("cuda_peak_bytes") for d in data if d.get("cuda_peak_bytes") is not None]
    worker.cuda_peak_bytes = max(cuda_peaks) if cuda_peaks else None
    uss_count = sum(1 for d in data if d.get("uss_bytes") is not None)
    host_metric = "uss_bytes" if uss_count >= len(data) / 2 else "rss_bytes"
    verdicts: list[LeakVerdict] = [
        detect_leak(times, [d.get(host_metric) for d in data], steps=steps, policy=policy, metric=host_metric)
    ]
    if any(d.get("cuda_allocated_bytes") is not None for d in data):
        verdicts.insert(0, detect_leak(times, [d.get("cuda_allocated_bytes") for d in data], steps=steps,
                                       policy=policy, metric="cuda_allocated_bytes"))
    chosen = next((v for v in verdicts if v.leak), verdicts[-1])
    worker.leak, worker.reason, worker.evidence = chosen.leak, chosen.reason, chosen.to_dict()
    worker.status = chosen.status
    worker.slope_bytes_per_s, worker.slope_bytes_per_step = chosen.slope_bytes_per_s, chosen.slope_bytes_per_step
    worker.series = _thin([d.get(chosen.metric) for d in data if d.get(chosen.metric) is not None])
    return worker


def memory_report(store, *, rank: int | list[int] | None = None, since: float | None = None,
                  job: str | list[str] | None = None, policy: LeakPolicy | None = None) -> MemoryReport:
    """Per-worker memory of a run (``store``: an open :class:`EvidenceStore`), sorted by rank.

    ``rank``, ``since`` (a Unix time) and ``job`` (a Ray job id) narrow the samples judged.
    """
    groups: dict[tuple[Any, Any], dict[str, list]] = {}
    for item in store.query("memory", rank=rank, since=since, job=job):
        source = item.data.get("source") or "watch"
        if source not in TREND_SOURCES:
            continue
        key = (item.data.get("node_ip", item.node_ip), item.data.get("pid", item.pid))
        groups.setdefault(key, {}).setdefault(source, []).append(item)
    workers = []
    for by_source in groups.values():
        records = max(by_source.values(), key=len)  # one source per worker: the denser one
        workers.append(summarise(records, policy))
    workers.sort(key=lambda w: (w.rank is None, w.rank if w.rank is not None else 0, w.node_ip or "", w.pid or 0))
    return MemoryReport(store=str(store.path), workers=workers)


# ------------------------------------------------------------ from outside


@dataclasses.dataclass
class SampleRun:
    """What one round of external sampling did."""

    workers: int
    rounds: int
    samples: int
    seconds: float
    problems: list[str] = dataclasses.field(default_factory=list)


def _targets(labels: dict) -> tuple[dict[str, list[int]], dict[tuple, dict], list[str]]:
    """Per node: the pids of Ray worker processes to sample (idle and raysleuth's own left out)."""
    from raysleuth.agents import call_agents

    per_node: dict[str, list[int]] = {}
    headers: dict[tuple, dict] = {}
    problems = []
    for result in call_agents("list_processes", False, timeout=15):
        if not result.ok:
            problems.append(f"node {result.node_ip}: {result.error}")
            continue
        for proc in result.value:
            title = proc.get("title") or ""
            label = labels.get((result.node_ip, proc["pid"]), {})
            actor_class = label.get("actor_class")
            if title.startswith("ray::IDLE") or actor_class in OWN_ACTORS or any(
                    title.startswith(f"ray::{own}") for own in OWN_ACTORS):
                continue
            per_node.setdefault(result.node_id, []).append(proc["pid"])
            headers[(result.node_id, proc["pid"])] = {
                "node_id": result.node_id, "node_ip": result.node_ip, "pid": proc["pid"],
                "actor_id": label.get("actor_id"), "actor_name": label.get("actor_name"),
                "actor_class": actor_class or (title[5:].split(".")[0] if title.startswith("ray::") else None),
                "client_id": None, "_rank": label.get("rank"),
            }
    return per_node, headers, problems


def sample_workers(duration: float = 30.0, interval: float = 1.0, *, timeout: float = 15.0) -> SampleRun:
    """Sample every Ray worker process's RSS/USS through the node agents for ``duration`` seconds.

    Needs a connected Ray. Each sample is written to the run's evidence as
    kind ``memory`` with ``source: "agent"`` and the worker's identity.
    """
    import ray

    from raysleuth.agents import get_agents
    from raysleuth.recorder import get_writer

    from raysleuth.labels.live import worker_labels

    labels = worker_labels()  # ranks from raysleuth, Ray Train's logs, the start-up environment, names
    per_node, headers, problems = _targets(labels)
    agents = get_agents(timeout=timeout)  # handles looked up once, not every round
    writer = get_writer()
    rounds = samples = 0
    pending: list = []
    rows: dict[tuple[str, int], list] = {}

    def send() -> None:  # one write per worker every 20 rounds: few calls to the writer
        for key, batch in rows.items():
            header = {k: v for k, v in headers.get(key, {"node_id": key[0], "pid": key[1]}).items() if k != "_rank"}
            pending.append(writer.write.remote(header, batch))
        rows.clear()

    started = next_round = time.monotonic()  # the duration counts from the first sample
    while True:
        if rounds and rounds % 20 == 0:
            per_node, headers, more = _targets(labels)
            problems += more
        now = time.time()
        refs = {node: agents[node][0].memory.remote(pids) for node, pids in per_node.items() if node in agents}
        ready, missing = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout) if refs else ([], [])
        for node, ref in refs.items():
            node_ip = agents[node][1]
            if ref in missing:
                problems.append(f"node {node_ip}: no answer from the agent within {timeout:g}s")
                continue
            try:
                value = ray.get(ref)
            except Exception as error:
                problems.append(f"node {node_ip}: {type(error).__name__}: {str(error)[:200]}")
                continue
            for pid, memory in value.items():
                header = headers.get((node, int(pid)))
                if header is None or "error" in memory:
                    continue
                data = {"rss_bytes": memory.get("rss"), "uss_bytes": memory.get("uss"),
                        "cuda_allocated_bytes": None, "cuda_reserved_bytes": None, "cuda_peak_bytes": None,
                        "vms_bytes": memory.get("vms"), "source": "agent", "pid": int(pid), "node_ip": node_ip}
                rows.setdefault((node, int(pid)), []).append(
                    ("memory", now, header["_rank"], None, None, None, None, data, None))
                samples += 1
        if rounds % 20 == 19:
            send()
        rounds += 1
        next_round += interval
        if time.monotonic() - started + max(0.0, next_round - time.monotonic()) > duration:
            break
        time.sleep(max(0.0, next_round - time.monotonic()))
    send()
    try:
        ray.get(pending, timeout=timeout)
    except Exception as error:
        problems.append(f"the writer did not confirm every sample: {error}")
    return SampleRun(workers=len(headers), rounds=rounds, samples=samples,
                     seconds=time.monotonic() - started, problems=sorted(set(problems)))
