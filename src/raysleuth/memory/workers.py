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
import itertools
import operator
import time
from collections.abc import Callable
from typing import Any

from raysleuth import evidence
from raysleuth.cluster import own
from raysleuth.memory.series import METRICS, _as_int, _present, _Series, _thin_array, exact_last, sparkline
from raysleuth.memory.trend import LeakPolicy, detect_leak, leaks
from raysleuth.recorder import blocks, reading
from raysleuth.recorder.reading import bulk

__all__ = ["MemoryReport", "SampleRun", "WorkerMemory", "memory_report", "sample_workers", "sparkline"]

#: Sources whose samples are periodic and feed the trend.
TREND_SOURCES = ("watch", "agent")


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


#: What the reader takes from each ``memory`` row: columns, then ``data`` fields (read in SQL, see
#: :func:`raysleuth.recorder.reading.select`).
_COLUMNS = ("time", "id", "rank", "step", "pid", "node_ip")
#: Read once a worker, from its newest row (not for each of its samples).
_IDENTITY = ("node_id", "actor_class", "actor_name")
_FIELDS = ("source", "pid", "node_ip") + METRICS


def summarise(records: list, policy: LeakPolicy | None = None) -> WorkerMemory:
    """One worker's :class:`WorkerMemory` from its ``memory`` records (one source, time order)."""
    series = _Series()
    rows = []
    for r in records:
        m = evidence.Memory.from_record(r)
        rows.append((r.time, r.id, r.rank, r.step, m.pid if "pid" in m.raw else r.pid,
                     m.node_ip if "node_ip" in m.raw else r.node_ip, m.source if "source" in m.raw else None,
                     None, None, *(getattr(m, metric) for metric in METRICS)))
    series.add(rows)
    newest = max(records, key=lambda r: (r.time, r.id))
    series.identity = (newest.node_id, newest.actor_class, newest.actor_name)
    return _summarise_series(series, policy)


def _summarise_series(series: _Series, policy: LeakPolicy | None, per_step: bool = True,
                      lines: bool = True) -> WorkerMemory:
    times, steps, values = series.ordered()  # NaN: no value (the leak test reads columns as they are)
    last = series.last
    latest = dict(zip(METRICS, last[9:]))
    node_id, actor_class, actor_name = series.identity
    worker = WorkerMemory(
        rank=series.rank, pid=last[4] if last[7] is None else last[7],
        node_ip=last[5] if last[8] is None else last[8], node_id=node_id, actor_class=actor_class,
        actor_name=actor_name, source=last[6], samples=len(times), first_time=float(times[0]),
        last_time=float(times[-1]),
        rss_bytes=latest["rss_bytes"], uss_bytes=latest["uss_bytes"],
        cuda_allocated_bytes=latest["cuda_allocated_bytes"], cuda_reserved_bytes=latest["cuda_reserved_bytes"],
    )
    present = {metric: _present(column) for metric, column in values.items()}  # NaN: no value
    rss, cuda_peaks = present["rss_bytes"], present["cuda_peak_bytes"]
    worker.peak_bytes = _as_int(float(rss.max())) if len(rss) else None
    worker.cuda_peak_bytes = _as_int(float(cuda_peaks.max())) if len(cuda_peaks) else None
    host_metric = "uss_bytes" if len(present["uss_bytes"]) >= len(times) / 2 else "rss_bytes"
    # the device's verdict when it leaks, else the host's: only the chosen one's evidence lines are fitted
    metric = host_metric
    if len(present["cuda_allocated_bytes"]) and leaks(times, values["cuda_allocated_bytes"], policy=policy):
        metric = "cuda_allocated_bytes"
    chosen = detect_leak(times, values[metric], steps=steps if per_step else None, policy=policy, metric=metric,
                         lines=lines)
    worker.leak, worker.reason, worker.evidence = chosen.leak, chosen.reason, chosen.to_dict()
    worker.status = chosen.status
    worker.slope_bytes_per_s, worker.slope_bytes_per_step = chosen.slope_bytes_per_s, chosen.slope_bytes_per_step
    worker.series = _thin_array(present[chosen.metric])
    return worker


#: The fields of a row :func:`_worker_key` reads: rows equal in these are one worker's.
_IDENTITY_FIELDS = operator.itemgetter(4, 5, 6, 7, 8)


def _worker_key(row: tuple) -> tuple:
    """(node ip, pid, source) of a memory row: the data's own pid and ip first (agent samples)."""
    source = row[6] or "watch"
    return (row[8] if row[8] is not None else row[5], row[7] if row[7] is not None else row[4], source)


#: A sender number ``senders`` does not hold (a foreign row's NULL): no pid, node ip or identity, as the view's join.
_NO_SENDER = (None,) * (2 + len(_IDENTITY))


def _sender_key(senders: dict[int, tuple]):
    """:func:`_worker_key` of a row that holds its sender's number (in place of its pid and node ip)."""

    def key(row: tuple) -> tuple:
        pid, node_ip = senders.get(row[4], _NO_SENDER)[:2]
        return (row[8] if row[8] is not None else node_ip, row[7] if row[7] is not None else pid, row[6] or "watch")

    return key


def memory_report(store, *, rank: int | list[int] | None = None, since: float | None = None,
                  job: str | list[str] | None = None, policy: LeakPolicy | None = None,
                  per_step: bool = True, fit_quiet: int | None = None, fit_past: int | None = None,
                  on_block: Callable[[int, Any, Any, Any], None] | None = None) -> MemoryReport:
    """Per-worker memory of a run (``store``: an open :class:`EvidenceStore`), sorted by rank.

    ``rank``, ``since`` (a Unix time) and ``job`` (a Ray job id) narrow the samples judged: those of the blocks read
    as float columns, the rest field by field in SQL, a batch at a time, never as records. ``per_step=False``: no
    line in steps (``slope_bytes_per_step`` None; a reader that shows none of it, the table of ``raysleuth memory``:
    one Theil-Sen fit less a worker, the same verdicts). ``fit_quiet``: at most this many workers that do not leak
    get their evidence lines (slope, R², tau), those whose memory grew most; the others' are None (their verdicts
    and reasons are the same), past ``fit_past`` workers (default: ``fit_quiet``); the growth orders them, then the
    rank order of the report. The lines are most of the cost: the report of a thousand workers lists the leaks and
    the few that grew most (None: every worker's lines). ``on_block``: called with each sender's samples in the
    blocks (sender, times, ranks, RSS; before ``rank``, ``since`` narrow them), for another reader of the same
    blocks (the report's curves: :class:`~raysleuth.recorder.blocks.RssRuns`).
    """
    groups: dict[tuple[Any, Any], dict[str, _Series]] = {}
    batch: list[tuple] = []
    # rows then read their sender's number, not its identity through the view's join (None before schema 3)
    senders = reading.senders(store, ("pid", "node_ip") + _IDENTITY)
    worker_key = _worker_key if senders is None else _sender_key(senders)
    # the sender's number in the pid and node ip places, so a row keeps the layout _Series and the key read
    columns = _COLUMNS if senders is None else _COLUMNS[:4] + ("sender", "sender")

    def take() -> None:
        # runs of rows with the same identity fields (compared in C), then each run's worker: a worker's rows
        # reach its series in the order read, as with a key computed for every row
        for _, run in itertools.groupby(batch, key=_IDENTITY_FIELDS):
            rows = list(run)
            node_ip, pid, source = worker_key(rows[0])
            if source in TREND_SOURCES:
                groups.setdefault((node_ip, pid), {}).setdefault(source, _Series()).add(rows)
        batch.clear()

    # what the writer sealed into blocks (recorder.blocks) comes as columns; only the rest row by row, the top
    # of the passes read in the same snapshot as both
    with bulk(), blocks.snapshot(store):  # the rows and columns all stay alive: nothing for the collector to find
        high = blocks.top(store) if senders is not None else 0
        if high:
            _take_blocks(store, high, groups, worker_key, rank=rank, since=since, job=job, on_block=on_block,
                         stepped=per_step)
        for clause in blocks.beyond(high):
            for row in store.select("memory", columns, _FIELDS, order="rank", rank=rank, since=since, job=job,
                                    clause=clause, by_id=bool(high) and rank is None):  # one rank: its index
                batch.append(row)
                if len(batch) >= 20_000:
                    take()
            take()
    chosen = [max(by_source.values(), key=lambda s: sum(len(c[0]) for c in s.chunks))  # the denser source
              for by_source in groups.values()]
    exact_last(store, chosen)
    if senders is None:
        newest = [series.last[1] for series in chosen]
        identities = {row[0]: row[1:] for start in range(0, len(newest), 5000)
                      for row in store.select(None, ("id",) + _IDENTITY, order=None, ids=newest[start:start + 5000])}
        for series in chosen:
            series.identity = identities.get(series.last[1], series.identity)
    else:  # the newest row's pid, node ip and identity are its sender's
        for series in chosen:
            sender = senders.get(series.last[4], _NO_SENDER)
            series.last = series.last[:4] + sender[:2] + series.last[6:]
            series.identity = sender[2:]
    with bulk():  # a verdict and its evidence per worker, all kept
        lines = fit_quiet is None or len(chosen) <= (fit_quiet if fit_past is None else max(fit_past, fit_quiet))
        workers = [_summarise_series(series, policy, per_step, lines) for series in chosen]
        order = sorted(range(len(workers)), key=lambda at: _rank_order(workers[at]))
        workers, chosen = [workers[at] for at in order], [chosen[at] for at in order]
        if not lines:  # the quiet ones that grew most get their lines after all
            quiet = [at for at, worker in enumerate(workers) if worker.status == "ok"]
            quiet.sort(key=lambda at: -workers[at].evidence["growth_bytes"])
            for at in quiet[:fit_quiet]:
                workers[at] = _summarise_series(chosen[at], policy, per_step)
    return MemoryReport(store=str(store.path), workers=workers)


def _rank_order(worker: WorkerMemory) -> tuple:
    """Where a worker stands in a report: by rank (none last), node ip and pid."""
    return worker.rank is None, worker.rank if worker.rank is not None else 0, worker.node_ip or "", worker.pid or 0


def _take_blocks(store, high: int, groups: dict, worker_key, *, rank, since, job, on_block=None,
                 stepped: bool = True) -> None:
    """Each sender's samples in the blocks of the passes up to ``high`` into its worker's series, through the
    reader's own filters (each handed to ``on_block`` first); ``stepped=False``: without their steps (not read)."""
    import numpy as np

    jobs = None if job is None else reading._listed(job)
    ranks = None if rank is None else np.array([rank] if isinstance(rank, int) else list(rank), dtype=np.int64)
    steps, rss = ("step",) if stepped else (), ("v0",) if on_block is not None else ()  # RSS's ints: the curves
    for sender, source, times, ints, numbers in blocks.read(store, high, job=jobs, ints=("id", "rank", *steps, *rss),
                                                            floats=(*steps, *blocks.INTS[3:]), ranks=ranks):
        if on_block is not None:
            on_block(sender, times, ints[1], ints[-1])
        keep = None if ranks is None else np.isin(ints[1], ranks)
        if since is not None:
            keep = times >= since if keep is None else keep & (times >= since)
        if keep is not None:
            if not keep.any():
                continue
            times, ints, numbers = times[keep], ints[:, keep], numbers[:, keep]
        key_row = (None,) * 4 + (sender, sender, source, None, None)
        node_ip, pid, source = worker_key(key_row)
        if source in TREND_SOURCES:
            series = groups.setdefault((node_ip, pid), {}).setdefault(source, _Series())
            series.add_block(times, ints, key_row, numbers, stepped)


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
    # lazy: raysleuth.memory loads in every worker (the logger's memory alert); agents only when the CLI samples
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
            if title.startswith("ray::IDLE") or own.is_own(class_name=actor_class) or own.is_own_title(title):
                continue
            per_node.setdefault(result.node_id, []).append(proc["pid"])
            headers[(result.node_id, proc["pid"])] = {
                "node_id": result.node_id, "node_ip": result.node_ip, "pid": proc["pid"],
                "actor_id": label.get("actor_id"), "actor_name": label.get("actor_name"),
                "actor_class": actor_class or (title[5:].split(".")[0] if title.startswith("ray::") else None),
                "client_id": None, "_rank": label.get("rank"),
            }
    return per_node, headers, problems


def sample_workers(duration: float = 30.0, interval: float = 1.0, *, timeout: float = 15.0,
                   writer_timeout: float | None = None) -> SampleRun:
    """Sample every Ray worker process's RSS/USS through the node agents for ``duration`` seconds.

    ``timeout``: for the node agents; ``writer_timeout`` (default: ``timeout``): for the writer to confirm
    the samples at the end.

    Needs a connected Ray. Each sample is written to the run's evidence as
    kind ``memory`` with ``source: "agent"`` and the worker's identity.
    """
    import ray

    # lazy: raysleuth.memory loads in every worker; the agents, the writer and the labels only when the CLI samples
    from raysleuth.agents import get_agents
    from raysleuth.labels.live import worker_labels
    from raysleuth.recorder import get_writer

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
        ray.get(pending, timeout=timeout if writer_timeout is None else writer_timeout)
    except Exception as error:
        problems.append(f"the writer did not confirm every sample: {error}")
    return SampleRun(workers=len(headers), rounds=rounds, samples=samples,
                     seconds=time.monotonic() - started, problems=sorted(set(problems)))
