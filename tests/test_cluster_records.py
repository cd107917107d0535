"""The State API's records (raysleuth.cluster.records), built from what a real Ray lists.

The rows come from Ray itself (``ray.util.state`` and ``ray.nodes()`` on the
session cluster), never written by hand, so a Ray upgrade that renames a
field fails here first.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import ray

from polling import poll

from raysleuth import cluster
from raysleuth.cluster.records import RayActor, RayNode, RayTask, RayWorker


@ray.remote(num_cpus=0)
class RecordsProbe:
    def where(self):
        return os.getpid(), ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=0)
def records_probe_task():
    return os.getpid()


def _state_rows(function, **filters):
    """Rows of one State API listing, as Ray returns them (dicts), filtered like ``cluster.state`` does."""
    from ray.util import state

    found = getattr(state, function)(address=ray.get_runtime_context().gcs_address, detail=True, timeout=30,
                                     filters=[(key, "=", value) for key, value in filters.items()] or None,
                                     raise_on_missing_output=False)
    return [row if isinstance(row, dict) else dataclasses.asdict(row) for row in found]


@pytest.fixture(scope="module")
def probe(ray_cluster):
    actor = RecordsProbe.options(name="records_probe_rank4").remote()
    pid, node_id = ray.get(actor.where.remote())
    task_pid = ray.get(records_probe_task.remote())
    yield actor, pid, node_id, task_pid
    ray.kill(actor)


def test_actor_task_node_and_worker_records_from_real_rows(probe, ray_cluster):
    actor, pid, node_id, task_pid = probe
    rows = poll(lambda: _state_rows("list_actors", name="records_probe_rank4"), timeout=30.0, interval=0.3)
    assert len(rows) == 1 and isinstance(rows[0], dict)
    record = RayActor.from_state(rows[0])
    assert record.class_name == "RecordsProbe" and record.name == "records_probe_rank4"
    assert record.state == "ALIVE" and record.pid == pid and record.node_id == node_id
    assert record.job_id == ray.get_runtime_context().get_job_id() and len(record.actor_id) == 32
    assert record.required_resources == {} and record.num_restarts == 0 and not record.death.recorded
    assert record.to_dict() == rows[0]  # JSON output keeps Ray's own keys

    nodes = [RayNode.from_state(row) for row in ray.nodes()]
    assert {node.node_id for node in nodes} >= {ray_cluster.head_node_id, ray_cluster.worker_node_id}
    assert [node.is_head_node for node in nodes].count(True) == 1
    mine = next(node for node in nodes if node.node_id == node_id)
    assert mine.alive and mine.node_ip and mine.resources_total.get("CPU") == 8
    assert set(mine.to_dict()) >= {"node_id", "node_ip", "alive", "is_head_node", "resources_total", "labels"}

    def done_task():
        # the owner's FINISHED event may arrive before the worker's, which carries the worker pid
        return [row for row in _state_rows("list_tasks", name="records_probe_task")
                if row.get("state") == "FINISHED" and row.get("worker_pid")]

    task = RayTask.from_state(poll(done_task, timeout=30.0, interval=0.3)[0])
    assert task.name == "records_probe_task" and task.function.endswith("records_probe_task")
    assert task.state == "FINISHED" and task.type == "NORMAL_TASK" and task.worker_pid == task_pid
    assert task.start_time_ms and task.end_time_ms >= task.start_time_ms and task.creation_time_ms
    assert [event.state for event in task.events][-1] == "FINISHED"

    workers = [RayWorker.from_state(row) for row in _state_rows("list_workers", is_alive="True")]
    worker = next(w for w in workers if w.pid == pid)
    assert worker.alive and worker.worker_type == "WORKER" and worker.node_id == node_id and worker.ip == mine.node_ip


def test_listings_return_records_and_a_killed_actor_names_its_cause(ray_cluster):
    doomed = RecordsProbe.options(name="records_doomed").remote()
    pid, _node = ray.get(doomed.where.remote())
    assert any(isinstance(a, RayActor) and a.pid == pid for a in cluster.actors(state="ALIVE"))
    ray.kill(doomed)

    def dead():
        return [a for a in cluster.actors(state="DEAD") if a.name == "records_doomed"]

    record = poll(dead, timeout=30.0, interval=0.3)[0]
    assert record.death.kind == "died" and record.death.reason == "RAY_KILL" and record.death.recorded
    text, on_purpose = cluster.death_reason(record)
    assert on_purpose and text.startswith("RAY_KILL")
