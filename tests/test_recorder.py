"""The batching client and the writer actor, end to end on a real cluster."""

import threading
import time

import pytest
import ray

from raysleuth.recorder import RecordClient, StoreSink, get_writer, open_store
from raysleuth.recorder.store import open_run


class GatedSink:
    """A real store behind a gate: deliveries wait (or fail) until opened."""

    def __init__(self, store, fail=False):
        self.store = store
        self.gate = threading.Event()
        self.fail = fail

    def deliver(self, header, rows):
        if self.fail:
            raise ConnectionError("writer down")
        self.gate.wait(10)
        self.store.write_batch(header, rows)


def test_full_buffer_drops_oldest_and_counts(tmp_path):
    store = open_run(tmp_path, "drops")
    sink = GatedSink(store)
    client = RecordClient(sink, capacity=5, batch_size=1, interval=0.01, spool_dir=tmp_path / "spool")
    client.record("event", {"n": 0})
    deadline = time.time() + 5
    while client._buffer and time.time() < deadline:  # the thread took row 0 and waits at the gate
        time.sleep(0.01)
    for n in range(1, 21):
        client.record("event", {"n": n})
    assert client.stats.dropped == 15
    sink.gate.set()
    assert client.flush(timeout=10)
    delivered = sorted(r.data["n"] for r in store.query("event"))
    assert delivered == [0, 16, 17, 18, 19, 20]
    assert client.stats.delivered == 6


def test_unreachable_sink_spools_then_delivers_once(tmp_path):
    store = open_run(tmp_path, "spool")
    sink = GatedSink(store, fail=True)
    client = RecordClient(sink, batch_size=7, interval=0.01, spool_dir=tmp_path / "spool")
    for n in range(50):
        client.record("log", {"n": n})
    assert client.flush(timeout=5) is False
    assert client.spool_path.exists()
    assert client.stats.spooled == 50 and client.stats.delivered == 0
    lines = [line for line in client.spool_path.read_text().splitlines() if not line.startswith('{"header"')]
    assert len(lines) == 50 and lines[0].startswith('["log"')  # JSON, never pickle
    sink.fail = False
    sink.gate.set()
    for n in range(50, 60):
        client.record("log", {"n": n})
    assert client.flush(timeout=10)
    assert not client.spool_path.exists()
    assert sorted(r.data["n"] for r in store.query("log")) == list(range(60))
    client.close()


def test_record_never_raises_on_unserialisable_data(tmp_path):
    store = open_run(tmp_path, "odd")
    client = RecordClient(StoreSink(store), interval=0.01, spool_dir=tmp_path / "spool")
    client.record("event", {"obj": object(), "set": {1, 2}})
    assert client.flush(timeout=5)
    data = store.query("event")[0].data
    assert data["obj"].startswith("<object object")


@ray.remote(num_cpus=0)
class Chatty:
    """Records steadily from a background loop while the test kills the writer."""

    def __init__(self, rank):
        import raysleuth as rs

        rs.set_rank(rank)
        self.done = threading.Event()

    def run(self, count, pause):
        from raysleuth.recorder import get_client, record

        for n in range(count):
            record("event", {"n": n}, name="chatty")
            time.sleep(pause)
        ok = get_client().flush(timeout=60)
        stats = get_client().stats
        return {"ok": ok, "recorded": stats.recorded, "delivered": stats.delivered,
                "spooled": stats.spooled, "failures": stats.failures, "client": get_client().client_id}


@pytest.mark.parametrize("relay", ["0", "1"], ids=["straight", "through-the-node-agent"])
def test_writer_killed_mid_stream_loses_nothing(ray_cluster, relay):
    """Straight to the writer, the outage fails deliveries, which spool and arrive later. Through the node
    agent, a call the agent makes while the writer restarts waits for it (Ray queues calls to a restarting
    actor) or fails (then its ranks spool): either way every record is stored once."""
    from raysleuth import agents

    writer = get_writer()
    ray.get(writer.info.remote())
    by_node = agents.get_agents(timeout=60)  # (the writer makes them within seconds)

    def relayed() -> int:
        return sum(ray.get(handle.relayed.remote(), timeout=60)["deliveries"]["batches"]
                   for handle, _ip in by_node.values())

    relayed_before = relayed()
    actor = Chatty.options(runtime_env={"env_vars": {"RAYSLEUTH_RELAY": relay}}).remote(3)
    ref = actor.run.remote(400, 0.01)
    deadline = time.monotonic() + 60  # a loaded machine starts actors slowly: kill only once it streams
    while time.monotonic() < deadline and not any(
            c.get("actor_class") == "Chatty" for c in ray.get(writer.clients.remote(), timeout=30)):
        time.sleep(0.1)
    ray.kill(writer, no_restart=False)  # the writer dies; Ray restarts it
    result = ray.get(ref, timeout=120)
    assert result["ok"], result
    assert result["recorded"] == 400
    if relay == "0":
        assert result["failures"] >= 1 and result["spooled"] > 0  # the outage really happened and was spooled
    else:
        assert relayed() > relayed_before, "no batch went through a node agent"
    assert result["delivered"] >= 400  # redelivered rows are deduplicated by the store
    info = ray.get(get_writer().info.remote(), timeout=30)
    assert info["received"] > 0  # a fresh writer process took over
    store = open_store(home=ray_cluster.home)
    assert store.check() == "ok"
    rows = [r for r in store.query("event", name="chatty") if r.client_id == result["client"]]
    assert sorted(r.data["n"] for r in rows) == list(range(400))
    assert {r.rank for r in rows} == {3}
    assert rows[0].actor_class == "Chatty"
    ray.kill(actor)


def test_throughput_is_reasonable(ray_cluster):
    """The bench measures this properly; here a floor that catches a broken batch path."""
    actor = Chatty.remote(0)
    started = time.monotonic()
    result = ray.get(actor.run.remote(20000, 0), timeout=120)
    seconds = time.monotonic() - started
    assert result["ok"] and result["delivered"] >= 20000
    assert 20000 / seconds > 2000, f"only {20000 / seconds:.0f} records/s"
    ray.kill(actor)


def test_connected_process_reads_its_own_run_even_when_another_is_latest(ray_cluster):
    """Two clusters writing under one home must not mix: `latest` is not ours."""
    from raysleuth import cluster
    from raysleuth.recorder.store import latest_run

    ray.get(get_writer().info.remote())
    open_run(ray_cluster.home, "some-other-cluster").add("doctor", {"ok": True})
    assert latest_run(ray_cluster.home) == "some-other-cluster"
    assert open_store(home=ray_cluster.home).path.parent.name == cluster.session_name()
    assert open_store("some-other-cluster", home=ray_cluster.home).count("doctor") == 1
    marker = ray_cluster.home / "runs" / "latest"
    marker.write_text(cluster.session_name())  # leave `latest` as the session found it
