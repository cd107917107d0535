"""Node agents: each node's spool reaches the writer through its agent; agents run and read only what raysleuth needs (issue 24)."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import time
import uuid

import pytest


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _rows(path, client_id: str) -> list[tuple]:
    """Read the run's database raw (a reader would ingest local spool files itself and hide the agent's work)."""
    if not path.is_file():
        return []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute("SELECT kind, level, data FROM records WHERE client_id = ?", (client_id,)).fetchall()
    finally:
        db.close()


def test_a_dead_workers_spool_on_another_node_reaches_the_run_through_that_nodes_agent(ray_cluster):
    import ray

    from raysleuth import agents, cluster
    from raysleuth.recorder import get_writer, spool
    from raysleuth.recorder.store import DB_NAME, run_dir

    run_id = cluster.session_name()
    writer = get_writer()
    agents.get_agents()  # this job uses the agents: the writer keeps one on every node while it is alive
    before = ray.get(writer.info.remote(), timeout=60)["forwarded"]
    client_id = uuid.uuid4().hex[:16]
    header = {"client_id": client_id, "pid": _dead_pid(), "node_id": ray_cluster.worker_node_id, "rank": 3}
    rows = [["log", time.time(), 3, None, None, "victim", "WARNING", {"message": f"written ahead {n}"}, n]
            for n in range(3)]
    # The worker node's folder: the writer (head node) never reads it; only that node's agent does.
    folder = spool.node_spool_dir(ray_cluster.home, run_id, ray_cluster.worker_node_id)
    path = folder / f"{socket.gethostname()}-{header['pid']}-{client_id}.wal.jsonl"
    spool.append(path, header, rows)
    database = run_dir(ray_cluster.home, run_id) / DB_NAME
    deadline = time.monotonic() + 90
    while len(_rows(database, client_id)) < 3:
        assert time.monotonic() < deadline, "the worker node's spool never reached the run"
        time.sleep(0.5)
    assert not path.exists()
    assert sorted(level for _kind, level, _data in _rows(database, client_id)) == ["WARNING"] * 3
    agent = agents.get_agents()[ray_cluster.worker_node_id][0]
    assert ray.get(agent.forwarded.remote(), timeout=60)["rows"] >= 3
    assert ray.get(writer.info.remote(), timeout=60)["forwarded"] >= before + 3


def test_an_agent_runs_and_reads_only_what_raysleuth_needs_and_can_be_removed(ray_cluster):
    import ray

    from raysleuth import agents
    from raysleuth.stacks.capture import PS_ARGV

    agent = agents.get_agents()[ray_cluster.worker_node_id][0]
    listing = ray.get(agent.run_tool.remote(PS_ARGV, 10), timeout=60)
    assert listing["returncode"] == 0 and listing["stdout"]
    refused = [["cat", "/etc/passwd"], ["sh", "-c", "id"], ["/tmp/elsewhere/ps", "-e"], ["py-spy", "record", "-o", "x"]]
    for argv in refused:
        with pytest.raises(Exception, match="run_tool refuses"):
            ray.get(agent.run_tool.remote(argv, 5), timeout=60)
    with pytest.raises(Exception, match="run_tool refuses"):
        ray.get(agent.run_tools.remote([PS_ARGV, ["bash", "-c", "id"]], 5), timeout=60)
    marker = ray_cluster.home / "agent-readable.txt"
    marker.write_text("evidence")
    assert ray.get(agent.read_files.remote([str(marker)]), timeout=60) == {str(marker): "evidence"}
    for path in ("/etc/passwd", "/proc/1/environ", str(ray_cluster.home / ".." / ".." / "etc" / "hostname")):
        with pytest.raises(Exception, match="read_files refuses"):
            ray.get(agent.read_files.remote([path]), timeout=60)

    from raysleuth.recorder.writer import AGENT_FORWARD_S, AGENTS_CONTROL, get_writer

    handles = [handle for handle, _ip in agents.get_agents().values()]
    removed = agents.remove_agents()
    assert len(removed) >= 2 and all(name.startswith(agents.AGENT_PREFIX) for name in removed)
    for handle in handles:  # ray.kill is asynchronous: a call sent at once may still be answered
        deadline = time.monotonic() + 30
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(handle.ping.remote(), timeout=60)
                time.sleep(0.5)
    time.sleep(AGENT_FORWARD_S + 2)  # the writer's next rounds make none again
    assert agents.existing_agents() == []
    try:
        assert ray.get(agents.get_agents()[ray_cluster.worker_node_id][0].ping.remote(), timeout=120)  # on demand
    finally:
        ray.get(get_writer().set_control.remote(AGENTS_CONTROL, None), timeout=60)  # back to the default
