"""Verdicts that must not be false or too sure (issue 17), on the live test cluster."""

from __future__ import annotations

import time

import ray
from polling import poll

TIMEOUT = 60.0


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

        return any(a.actor_id == actor_id and a.state == "DEAD" for a in cluster.actors().items)

    assert poll(listed_by_ray), "Ray should list the failed writer as DEAD"
    report = find_tasks(ray_cluster.address, pending=False, stuck=False)
    assert actor_id not in {item.actor_id for item in report.dead_actors}
    assert actor_id not in {item.actor_id for item in report.failed}
    assert not any("EvidenceWriter" in (item.name or "") for item in report.failed)


def _watch(address: str, capsys) -> tuple[int, dict]:
    import json

    from raysleuth.cli import main

    code = main(["watch", "--address", address, "--stall", "3", "--json", "--duration", "90", "--interval", "0.5",
                 "--timeout", "60"])
    return code, json.loads(capsys.readouterr().out)


def test_watch_after_the_training_loop_finished_is_not_a_stall(ray_cluster, capsys):
    """The loop returned, actors still alive: the old verdict was "stall: every rank stopped", exit 1."""
    from victims import hangs

    steppers = [hangs.Stepper.options(name=f"finished_rank{rank}").remote(rank, 3) for rank in range(3)]
    try:
        assert ray.get([s.run.remote(8, -1, -1, 0.05) for s in steppers], timeout=120) == [8, 8, 8]
        code, out = _watch(ray_cluster.address, capsys)
        assert code == 0, out
        assert out["finished"] is True and out["summary"].startswith("finished: every rank stopped at step 7")
    finally:
        hangs.kill(*steppers)


def test_every_rank_hung_inside_its_step_is_still_a_stall(ray_cluster, capsys):
    from victims import hangs

    steppers = [hangs.Stepper.options(name=f"allhung_rank{rank}").remote(rank, 3) for rank in range(3)]
    try:
        ray.get([s.pid.remote() for s in steppers], timeout=120)
        for rank, stepper in enumerate(steppers):
            stepper.run.remote(600, rank, 3)  # every rank blocks in read_shard at step 3
        code, out = _watch(ray_cluster.address, capsys)
        assert code == 1, out  # a stall, not "finished": every rank is still inside its call
        assert out["stalled"] and {r["rank"] for r in out["stalled"]} <= {0, 1, 2}
        assert "finished" not in out["summary"]
    finally:
        hangs.kill(*steppers)


# ------------------------------------------------------------------- pools

def test_a_worker_no_node_can_ever_hold_fails_up_front_instead_of_queueing():
    import pytest

    from raysleuth.errors import UsageError
    from raysleuth.pool import plan_placements

    nodes = [{"node_id": "a", "node_ip": "10.0.0.1", "resources_total": {"CPU": 4}},
             {"node_id": "b", "node_ip": "10.0.0.2", "resources_total": {"CPU": 2}}]
    with pytest.raises(UsageError, match="no node can ever hold a worker of 6 CPU: the largest node has 4"):
        plan_placements(nodes, 1, use_gpu=True, cpu_per_worker=6)  # the old plan said "will queue"
    queued = plan_placements(nodes, 3, use_gpu=False, cpu_per_worker=3)  # fits a node, not all at once
    assert "will queue until one frees up" in queued.warnings[0]


def test_a_pool_that_can_never_start_together_fails_up_front():
    import pytest

    from raysleuth.errors import UsageError
    from raysleuth.pool import plan_placements
    from raysleuth.pool.allocator import check_starts_together

    nodes = [{"node_id": "a", "node_ip": "10.0.0.1", "resources_total": {"CPU": 4}}]
    plan = plan_placements(nodes, 4, use_gpu=True, cpu_per_worker=2, gpu_memory_per_worker=4)  # the README's
    with pytest.raises(UsageError, match=r"4 workers x 2 CPU need 8 CPU, but the cluster has 4 CPU") as caught:
        check_starts_together(plan, nodes)
    assert "cpu_cores_per_worker=1" in caught.value.fix
    check_starts_together(plan_placements(nodes, 4, use_gpu=False, cpu_per_worker=1), nodes)  # fits: no error


def test_pool_with_the_readme_arguments_on_a_too_small_cluster_fails_at_once(ray_cluster):
    import pytest

    from raysleuth.errors import UsageError
    from raysleuth.pool import RayResourcePool

    started = time.monotonic()
    with pytest.raises(UsageError, match="could never start while the others run"):
        RayResourcePool(num_workers=4, use_gpu=True, debug_mode=True, cpu_cores_per_worker=6,
                        gpu_memory_per_worker=4, name="toobig")  # 24 CPU on a 16-CPU cluster
    assert time.monotonic() - started < 30  # not start_timeout (120 s)
    from raysleuth import cluster

    assert not [a for a in cluster.actors().items if str(a.name or "").startswith("toobig")]


def test_pool_compare_shows_the_real_exception_and_its_rank(ray_cluster):
    from raysleuth.pool import RayResourcePool
    from victims import pool_victims

    pool = RayResourcePool(num_workers=2, cpu_cores_per_worker=0.1, name="comparefails", start_timeout=90)
    try:
        started = time.monotonic()
        report = pool.compare(pool_victims.weights_or_fail, timeout=60)
        assert time.monotonic() - started < 55
        assert not report.consistent and report.missing_ranks == [1]
        assert "KeyError: 'layer.3.weight'" in report.error and "rank(s) [1]" in report.error
        assert "pool_victims.py" in report.error and "weights_or_fail" in report.error
        assert "did not arrive" not in report.summary()
    finally:
        pool.shutdown()
