"""The write path at a 1,000-rank full-mode rate: the real writer, the real client, synthetic ranks.

Starts a local Ray (its own temp dir), the run's real writer actor
(``raysleuth.recorder.get_writer``) and ``--hosts`` host actors. Each host
carries ``--ranks / --hosts`` rank identities; every identity is its own
:class:`raysleuth.recorder.RecordClient` with the sink every worker gets
(``ray_sink()``: through its node's agent, which relays the node's batches
to the writer in one call; the delivery, spool and write-ahead code every
worker runs), its own control
poll (``raysleuth.control``'s one poll, once a second, as each worker
process does) and, at the end, its own seat in one consistency meeting
(``raysleuth.consistency.exchange.MailboxExchange``, the store transport).

The rows are ``bench/_synthetic.py``'s full-mode rows (memory every second,
a span and a heartbeat every 3 s, a log every 6 s, the collectives dumps),
replayed ``1000 / ranks`` times faster than real time, so the ranks
together write what 1,000 full-mode ranks write. The target rate is that
synthetic full hour's rows / 3,600 (computed here, from the same rows).

Counted: every record written (``recorded``), acknowledged, spooled and
dropped on the clients; every record stored (a count in the SQLite file);
the writer's RPCs by method (``info()["calls"]``) per second and per rank.

The same simulation then runs again with each client delivering straight
to the writer (``RAYSLEUTH_RELAY=0``, the write path before the relay): the
baseline for the writer's write calls a second.

Targets: nothing lost (stored == recorded), nothing spooled or dropped,
the sustained stored rate (from a sixth of the window to its end: a batch is
stored up to a client interval and a relay window after it was recorded)
>= the 1,000-rank full-mode rate, control polls <= 1 RPC a
second per node on the writer (not one per rank), a consistency meeting
<= 4 writer RPCs per rank (one exchange each rank reads once), and the
writer's write calls at most one per node agent per relay window (all the
ranks here share one node, so one agent), at least 5x fewer than straight.

Usage: python bench/bench_ingest.py [--ranks 160] [--hosts 4] [--seconds 30] [--ranks-per-node 8]
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

from _synthetic import rank_rows  # noqa: E402  (bench/ is on sys.path when run as a script)
from _targets import exit_code, target  # noqa: E402

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
FULL_RANKS = 1000
MEETING_RPCS_PER_RANK = 4.0


def full_mode_rate(world: int = FULL_RANKS) -> float:
    """Rows a second that ``world`` full-mode ranks write (bench_scale's synthetic full hour / 3,600)."""
    rows = rank_rows(1, world=world, minutes=60, mode="full", culprit=-1, leaker=-1, straggler=-1)
    return len(rows) * world / 3600.0


class Host:
    """One process carrying many rank identities, each with its own client and control poll."""

    def __init__(self, first: int, count: int, world: int, speed: float, relay: bool = True) -> None:
        from raysleuth import cluster
        from raysleuth.recorder import RecordClient, WriterSink
        from raysleuth.recorder.sinks import ray_sink

        self.ranks = list(range(first, first + count))
        self.world, self.speed = world, speed
        run_id = cluster.session_name()
        self.clients = {rank: RecordClient(ray_sink() if relay else WriterSink(), run_id=run_id)
                        for rank in self.ranks}
        self.stop = threading.Event()
        self.polls = 0
        self.threads: list[threading.Thread] = []
        self.merged: list = []

    def prepare(self, seconds: float) -> int:
        """Build the rows to feed for ``seconds`` (replayed ``speed`` times real time); how many ranks."""
        minutes = max(1.0, math.ceil(seconds * self.speed / 60.0) + 1.0)
        feeds = [[(row[1], rank, row) for row in rank_rows(rank, world=self.world, minutes=minutes, mode="full",
                                                             culprit=-1, leaker=-1, straggler=-1)]
                 for rank in self.ranks]
        for feed in feeds:
            feed.sort(key=lambda item: item[0])
        self.merged = list(heapq.merge(*feeds, key=lambda item: item[0]))
        return len(self.ranks)

    def start(self, seconds: float) -> None:
        """Feed the prepared rows for ``seconds`` and poll the controls; returns at once."""
        merged = self.merged
        self.threads = [threading.Thread(target=self._feed, args=(merged, seconds), daemon=True),
                        *(threading.Thread(target=self._poll, daemon=True) for _ in self.ranks)]
        for thread in self.threads:
            thread.start()

    def _feed(self, merged, seconds: float) -> None:
        began, origin = time.monotonic(), None
        for at, rank, row in merged:
            origin = at if origin is None else origin
            due = began + (at - origin) / self.speed
            if due - began >= seconds or self.stop.is_set():
                break
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
            kind, _t, _r, step, phase, name, level, data = row
            self.clients[rank].record(kind, data, name=name, level=level, step=step, phase=phase, rank=rank)

    def _poll(self) -> None:
        from raysleuth import control

        handle, seen = None, {}
        control.register("bench-ingest", lambda value: None)  # a handler: the poll reads the controls
        while not self.stop.wait(control.POLL_INTERVAL):
            handle = control._poll(handle, seen)
            self.polls += 1

    def finish(self) -> dict:
        """Stop feeding, deliver everything queued; the clients' counts."""
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        totals = {"recorded": 0, "delivered": 0, "spooled": 0, "dropped": 0, "failures": 0, "flushed": True}
        for client in self.clients.values():
            totals["flushed"] &= client.flush(timeout=60)
            for key in ("recorded", "delivered", "spooled", "dropped", "failures"):
                totals[key] += getattr(client.stats, key)
        totals["clients"] = [client.client_id for client in self.clients.values()]
        return totals

    def meet(self, base: str, timeout: float) -> list[int]:
        """Every identity here joins one consistency meeting (store transport); how many ranks each saw."""
        from raysleuth.consistency.exchange import MailboxExchange
        from raysleuth.recorder import get_writer

        writer = get_writer(create=False)
        seen: dict[int, int] = {}

        import ray

        from raysleuth.agents.controls import node_agent

        counter = node_agent(ray, "count")

        def seat(rank: int) -> None:
            exchange = MailboxExchange(rank, self.world, timeout, base, writer, counter)
            try:
                seen[rank] = len(exchange.round("fingerprints", {"rank": rank, "digest": "0" * 64},
                                                list(range(self.world))))
                exchange.close(list(range(self.world)), True)
            except Exception:
                seen[rank] = 0

        threads = [threading.Thread(target=seat, args=(rank,), daemon=True) for rank in self.ranks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout + 60)
        return [seen.get(rank, 0) for rank in self.ranks]


def stored_rows(path: str, clients: list[str]) -> int:
    """Rows in the run's SQLite file that these clients sent."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        marks = ",".join("?" * len(clients))
        return int(db.execute(f"SELECT count(*) FROM records WHERE client_id IN ({marks})", clients).fetchone()[0])
    finally:
        db.close()


def rates(before: dict, after: dict, seconds: float) -> dict[str, float]:
    """The writer's RPCs a second by method between two ``info()`` snapshots."""
    methods = set(before["calls"]) | set(after["calls"])
    return {m: (after["calls"].get(m, 0) - before["calls"].get(m, 0)) / seconds for m in sorted(methods)}


def _relayed() -> dict:
    """Control polls the node agents served and the writer reads they took (absent: no agent yet)."""
    import ray

    from raysleuth.cluster.own import AGENT_PREFIX, NAMESPACE

    totals: dict = {}
    for node in ray.nodes():
        try:
            agent = ray.get_actor(AGENT_PREFIX + node["NodeID"][:16], namespace=NAMESPACE)
            for kind, counts in ray.get(agent.relayed.remote(), timeout=30).items():
                for key, value in counts.items():
                    totals.setdefault(kind, {}).setdefault(key, 0)
                    totals[kind][key] += value
        except Exception:
            pass
    return totals


def drive(options: argparse.Namespace, relay: bool = True) -> dict:
    """Run the simulation on a fresh local Ray; every figure the targets need."""
    import ray

    from raysleuth import agents
    from raysleuth.recorder import get_writer

    ray.init(num_cpus=options.hosts + 2, include_dashboard=False, _temp_dir=options.temp, log_to_driver=False,
             namespace="raysleuth-bench-ingest")
    try:
        writer = get_writer(home=options.home)
        ray.get(writer.info.remote(), timeout=120)
        for handle, _ip in agents.get_agents(timeout=120).values():  # what the writer does within seconds
            ray.get(handle.ping.remote(), timeout=120)
        host_class = ray.remote(num_cpus=1, max_concurrency=4)(Host)
        share = options.ranks // options.hosts
        hosts = [host_class.remote(i * share, share if i < options.hosts - 1 else options.ranks - i * share,
                                   options.ranks, FULL_RANKS / options.ranks, relay) for i in range(options.hosts)]
        ray.get([host.prepare.remote(options.seconds) for host in hosts], timeout=300)
        before = ray.get(writer.info.remote(), timeout=60)
        began = time.monotonic()
        ray.get([host.start.remote(options.seconds) for host in hosts], timeout=300)
        time.sleep(max(0.0, options.seconds / 6 - (time.monotonic() - began)))
        early, early_at = ray.get(writer.info.remote(), timeout=60), time.monotonic()
        time.sleep(max(0.0, options.seconds - (time.monotonic() - began)))
        during = ray.get(writer.info.remote(), timeout=60)
        window = time.monotonic() - began
        steady = (during["received"] - early["received"]) / max(1e-9, time.monotonic() - early_at)
        counts = ray.get([host.finish.remote() for host in hosts], timeout=600)
        drained = ray.get(writer.info.remote(), timeout=60)
        relayed = _relayed()
        meeting_began = time.monotonic()
        seen = ray.get([host.meet.remote("bench-ingest/meeting", options.meeting_timeout) for host in hosts],
                       timeout=options.meeting_timeout + 300)
        meeting_s = time.monotonic() - meeting_began
        met = ray.get(writer.info.remote(), timeout=60)
    finally:
        ray.shutdown()
    clients = [client for count in counts for client in count["clients"]]
    totals = {key: sum(count[key] for count in counts) for key in ("recorded", "delivered", "spooled", "dropped",
                                                                   "failures")}
    return {"totals": totals, "flushed": all(count["flushed"] for count in counts), "window": window,
            "during": rates(before, during, window), "stored_in_window": during["received"] - before["received"],
            "steady": steady,
            "stored": stored_rows(drained["path"], clients), "meeting_s": meeting_s,
            "meeting_calls": {m: n - drained["calls"].get(m, 0) for m, n in sorted(met["calls"].items())
                              if m not in ("write", "get_controls", "ingest") and n > drained["calls"].get(m, 0)},
            "seen": [n for part in seen for n in part], "relayed": relayed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=160)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--meeting-timeout", type=float, default=60.0)
    options = parser.parse_args()
    options.home = tempfile.mkdtemp(prefix="raysleuth-ingest-")
    options.temp = tempfile.mkdtemp(prefix="rs-ing-")
    os.environ["RAYSLEUTH_HOME"] = options.home
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), os.environ.get("PYTHONPATH", "")])
    goal = full_mode_rate()
    nodes = math.ceil(options.ranks / options.ranks_per_node)
    print(f"{options.ranks} ranks ({nodes} nodes of {options.ranks_per_node}) on {options.hosts} hosts for "
          f"{options.seconds:g}s, replayed {FULL_RANKS / options.ranks:.2f}x; 1,000-rank full-mode rate "
          f"{goal:,.0f} rows/s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    fig = drive(options)
    options.home = tempfile.mkdtemp(prefix="raysleuth-ingest-direct-")
    os.environ["RAYSLEUTH_HOME"] = options.home
    direct = drive(options, relay=False)
    totals, during, window = fig["totals"], fig["during"], fig["window"]
    # the sustained rate: rows the writer took from the first sixth of the window to its end (a batch is stored
    # up to one client interval and one relay window after it was recorded: a lag, not a lower rate)
    rate = fig["steady"]
    print(f"clients: {totals}; stored {fig['stored']:,}; recorded {totals['recorded'] / window:,.0f} rows/s, "
          f"stored {rate:,.0f} rows/s sustained (from {window / 6:.0f}s to the end of the {window:.1f}s window)")
    print("writer RPCs/s while feeding: " + ", ".join(f"{m} {v:,.1f}" for m, v in during.items()))
    per_rank = {m: v / options.ranks for m, v in during.items()}
    print("per rank per second: " + ", ".join(f"{m} {v:.3f}" for m, v in per_rank.items())
          + f"; at 1,000 ranks: {sum(per_rank.values()) * FULL_RANKS:,.0f} writer RPCs/s")
    print(f"node agents relayed (before the meeting): {fig['relayed']}")
    writes = sum(during.get(m, 0.0) for m in ("write", "write_many"))
    straight = sum(direct["during"].get(m, 0.0) for m in ("write", "write_many"))
    print(f"writer write calls/s: {writes:,.1f} through the node agent, {straight:,.1f} straight "
          f"(RAYSLEUTH_RELAY=0, same run): {straight / max(writes, 1e-9):.1f}x fewer; straight, at 1,000 ranks: "
          f"{straight / options.ranks * FULL_RANKS:,.0f}/s; relayed, at 125 nodes: {writes * 125:,.0f}/s")
    calls = sum(fig["meeting_calls"].values())
    print(f"consistency meeting: {fig['meeting_s']:.1f}s, writer RPCs {fig['meeting_calls']} "
          f"({calls / options.ranks:.1f} a rank); every rank saw {min(fig['seen'], default=0)}-"
          f"{max(fig['seen'], default=0)} of {options.ranks}", flush=True)
    target("nothing lost", fig["stored"] == totals["recorded"] and fig["flushed"],
           f"stored {fig['stored']:,} of {totals['recorded']:,} recorded")
    target("nothing spooled or dropped", totals["spooled"] == 0 and totals["dropped"] == 0,
           f"spooled {totals['spooled']:,}, dropped {totals['dropped']:,}, failed deliveries {totals['failures']}")
    fed = totals["recorded"] / window
    short = "short of the goal: this machine could not drive the rate" if fed < goal else "enough"
    target("rate >= 1,000-rank full mode", rate >= goal,
           f"{rate:,.0f} rows/s ({rate / goal:.2f}x {goal:,.0f}; the hosts recorded {fed:,.0f}/s, {short})")
    polls = during.get("get_controls", 0.0)
    target("control polls <= 1/s per node", polls <= nodes * 1.1 + options.hosts,
           f"{polls:,.1f}/s on the writer for {nodes} nodes ({polls / options.ranks:.2f} a rank)")
    target(f"meeting <= {MEETING_RPCS_PER_RANK:g} writer RPCs a rank", calls / options.ranks <= MEETING_RPCS_PER_RANK,
           f"{calls / options.ranks:.1f} a rank")
    from raysleuth.agents.relay import RELAY_WINDOW_S

    target("write calls <= 1 per node agent per relay window", writes <= 1.0 / RELAY_WINDOW_S * 1.1,
           f"{writes:.2f}/s through one agent (window {RELAY_WINDOW_S:g}s)")
    target("write calls >= 5x fewer than straight", straight >= 5 * writes,
           f"{straight:,.1f}/s straight against {writes:,.1f}/s relayed ({straight / max(writes, 1e-9):.1f}x)")
    target("straight: nothing lost", direct["stored"] == direct["totals"]["recorded"] and direct["flushed"],
           f"stored {direct['stored']:,} of {direct['totals']['recorded']:,}")
    target("meeting complete", min(fig["seen"], default=0) == options.ranks, f"min {min(fig['seen'], default=0)}")
    return exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
