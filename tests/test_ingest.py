"""The write path with many ranks: every record arrives, nothing spools, controls are read once per node, and
each node's batches reach the writer together (issue 27).

Two host processes (one per node of the session cluster) each carry many
rank identities; every identity is a real :class:`RecordClient` delivering
through the sink every worker gets (``ray_sink()``: its node's agent, which
relays the node's batches to the session's real writer in one call), and
polls the controls as a worker's control thread does. ``bench/bench_ingest.py``
is the same at scale.
"""

from __future__ import annotations

import sqlite3
import threading
import time

RANKS_PER_HOST = 24
SECONDS = 3.0


class Host:
    """Many rank identities in one process: one client each, rows every 50 ms, a control poll every 0.25 s."""

    def __init__(self, first: int) -> None:
        from raysleuth import cluster
        from raysleuth.recorder import RecordClient
        from raysleuth.recorder.sinks import ray_sink

        run = cluster.session_name()
        self.clients = {rank: RecordClient(ray_sink(), run_id=run) for rank in range(first, first + RANKS_PER_HOST)}

    def run(self, seconds: float) -> dict:
        from raysleuth import control

        control.register("test-ingest", lambda value: None)
        polls = [0]

        def feed(rank: int, client) -> None:
            ends, n, handle = time.monotonic() + seconds, 0, None
            while time.monotonic() < ends:
                client.record("memory", {"uss_bytes": 6_000_000_000 + n, "source": "watch"}, rank=rank, step=n)
                if n % 10 == 0:
                    client.record("log", {"message": f"step {n}"}, name="train", level="INFO", rank=rank, step=n)
                if n % 5 == 0:
                    handle = control._poll(handle, {})  # a worker's poll: its node's agent, else the writer
                    polls[0] += 1
                n += 1
                time.sleep(0.05)

        threads = [threading.Thread(target=feed, args=item) for item in self.clients.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        flushed = all(client.flush(timeout=60) for client in self.clients.values())
        stats = [client.stats for client in self.clients.values()]
        return {"flushed": flushed, "recorded": sum(s.recorded for s in stats),
                "spooled": sum(s.spooled for s in stats), "dropped": sum(s.dropped for s in stats), "polls": polls[0],
                "failures": sum(s.failures for s in stats),
                "clients": [client.client_id for client in self.clients.values()]}


def _hosts(ray, nodes):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    host_class = ray.remote(num_cpus=0)(Host)
    hosts = [host_class.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
        i * RANKS_PER_HOST) for i, node in enumerate(nodes)]
    ray.get([host.__ray_ready__.remote() for host in hosts], timeout=120)
    return hosts


def _stored(path: str, clients: list[str]) -> int:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return db.execute(f"SELECT count(*) FROM records WHERE client_id IN ({','.join('?' * len(clients))})",
                          clients).fetchone()[0]
    finally:
        db.close()


def _relayed(ray, agents_by_node) -> dict[str, int]:
    totals: dict[str, int] = {}
    for handle, _ip in agents_by_node.values():
        for key, value in ray.get(handle.relayed.remote(), timeout=60)["deliveries"].items():
            totals[key] = totals.get(key, 0) + value
    return totals


def test_many_ranks_every_record_arrives_none_spooled_controls_once_per_node(ray_cluster):
    import ray

    from raysleuth import agents
    from raysleuth.recorder import get_writer

    writer = get_writer()
    nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]][:2]
    by_node = agents.get_agents(timeout=60)  # what the writer does every few seconds: an agent on every node
    hosts = _hosts(ray, nodes)
    before, relayed_before = ray.get(writer.info.remote(), timeout=60), _relayed(ray, by_node)
    try:
        results = ray.get([host.run.remote(SECONDS) for host in hosts], timeout=240)
        after, relayed = ray.get(writer.info.remote(), timeout=60), _relayed(ray, by_node)
    finally:
        for host in hosts:
            ray.kill(host)
    recorded = sum(r["recorded"] for r in results)
    clients = [client for r in results for client in r["clients"]]
    stored = _stored(after["path"], clients)
    assert all(r["flushed"] for r in results), results
    assert recorded > len(clients) * 10  # the hosts really wrote (at least ~0.5 s of rows each)
    assert stored == recorded, f"stored {stored} of {recorded}"
    assert sum(r["spooled"] for r in results) == 0 and sum(r["dropped"] for r in results) == 0, results
    polls = sum(r["polls"] for r in results)
    writer_polls = after["calls"].get("get_controls", 0) - before["calls"].get("get_controls", 0)
    assert polls >= len(clients) * 2
    # each node's agent reads the writer at most twice a second for all its ranks (plus other tests' workers)
    assert writer_polls < polls / 5, f"{writer_polls} writer polls for {polls} worker polls"
    # every batch went through its node's agent, and each agent's writer call carried many of them
    batches = relayed["batches"] - relayed_before.get("batches", 0)
    writer_calls = relayed["writer_calls"] - relayed_before.get("writer_calls", 0)
    writes = sum(after["calls"].get(m, 0) - before["calls"].get(m, 0) for m in ("write", "write_many"))
    assert relayed["rows"] - relayed_before.get("rows", 0) >= recorded, (relayed, recorded)
    assert batches >= len(clients) * 5 and writer_calls * 5 < batches, (batches, writer_calls)
    # at most one writer call per node per RELAY_WINDOW_S (0.5 s), plus other tests' workers, not one per batch
    assert writes < batches / 5, f"{writes} writer calls for {batches} client batches"


def test_an_agent_killed_while_its_ranks_deliver_loses_nothing(ray_cluster):
    """The node agent dies mid-run: its waiting deliveries fail, the clients spool those batches and send them
    again (straight to the writer, or to the restarted agent); every record is stored once."""
    import ray

    from raysleuth import agents
    from raysleuth.recorder import get_writer

    writer = get_writer()
    node = ray.get_runtime_context().get_node_id()
    agent, _ip = agents.get_agents(timeout=60)[node]
    [host] = _hosts(ray, [node])
    try:
        running = host.run.remote(SECONDS + 2)
        time.sleep(1.5)
        ray.kill(agent, no_restart=False)  # it restarts (max_restarts): a crash, not a removal
        result = ray.get(running, timeout=240)
        path = ray.get(writer.info.remote(), timeout=60)["path"]
    finally:
        ray.kill(host)
    assert result["flushed"] and result["dropped"] == 0, result
    assert result["recorded"] > RANKS_PER_HOST * 10 and result["failures"] > 0, result  # the kill hit deliveries
    assert _stored(path, result["clients"]) == result["recorded"], result
