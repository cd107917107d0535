"""Verdicts that must not be false or too sure (issue 17), on the live test cluster."""

from __future__ import annotations

import time

import ray

TIMEOUT = 60.0


def poll(predicate, timeout: float = TIMEOUT, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return value


def test_raysleuths_own_failed_writer_is_not_the_users_problem(ray_cluster, tmp_path):
    """`raysleuth tasks` listed raysleuth's writer as failed (ACTOR_CREATION_FAILED) and exited 1."""
    from raysleuth.recorder import EvidenceWriter
    from raysleuth.tasks import find_tasks

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")  # the writer cannot create its run under a file: its creation fails
    broken = ray.remote(EvidenceWriter).options(name="raysleuth-writer-broken", namespace="raysleuth",
                                                num_cpus=0).remote(str(not_a_folder), "run")
    try:
        ray.get(broken.info.remote(), timeout=TIMEOUT)
    except Exception:
        pass
    actor_id = broken._actor_id.hex()

    def listed_by_ray():
        from raysleuth import cluster

        return any(a.get("actor_id") == actor_id and a.get("state") == "DEAD" for a in cluster.actors().items)

    assert poll(listed_by_ray), "Ray should list the failed writer as DEAD"
    report = find_tasks(ray_cluster.address, pending=False, stuck=False)
    assert actor_id not in {item.actor_id for item in report.dead_actors}
    assert actor_id not in {item.actor_id for item in report.failed}
    assert not any("EvidenceWriter" in (item.name or "") for item in report.failed)
