"""Worker pools with debugging designed in, the allocator, and instrumenting existing actors."""

import time

import pytest
import ray

from raysleuth.errors import UsageError
from raysleuth.pool import RayResourcePool, SmartResourceAllocator, instrument, plan_placements
from raysleuth.recorder import get_client, open_store
from victims import pool_victims

CPU_NODES = [
    {"node_id": "a", "node_ip": "10.0.0.1", "is_head_node": True, "resources_total": {"CPU": 8}},
    {"node_id": "b", "node_ip": "10.0.0.2", "resources_total": {"CPU": 8}},
]
GPU_NODES = CPU_NODES + [
    {"node_id": "g", "node_ip": "10.0.0.3", "resources_total": {"CPU": 16, "GPU": 2, "accelerator_type:H100": 1},
     "gpu_memory_bytes": 80 * 1024**3, "labels": {"node-type": "h100"}},
]


def test_gpu_request_without_gpus_falls_back_to_cpu_with_a_warning():
    plan = plan_placements(CPU_NODES, 3, use_gpu=True, cpu_per_worker=2)
    assert plan.fell_back and all(not p.use_gpu and p.num_gpus == 0 for p in plan.placements)
    assert len(plan.warnings) == 3 and "cpu_backup" in plan.warnings[0]
    with pytest.raises(UsageError):
        plan_placements(CPU_NODES, 1, use_gpu=True, fallback_strategy="fail")
    waiting = plan_placements(CPU_NODES, 1, use_gpu=True, fallback_strategy="wait")
    assert waiting.placements[0].num_gpus == 1.0 and "wait" in waiting.warnings[0]


def test_gpu_memory_becomes_a_fraction_and_fills_the_node():
    plan = plan_placements(GPU_NODES, 5, use_gpu=True, gpu_memory_per_worker=20, cpu_per_worker=1)
    gpu = [p for p in plan.placements if p.use_gpu]
    assert len(gpu) == 5 and all(p.node_id == "g" and p.num_gpus == 0.25 for p in gpu)
    too_big = plan_placements(GPU_NODES, 1, use_gpu=True, min_gpu_memory=100)
    assert too_big.fell_back and "at least 100 GiB" in too_big.warnings[0]
    preferred = plan_placements(GPU_NODES, 1, use_gpu=False, preferred_node_type="h100")
    assert preferred.placements[0].node_id == "g"


def test_cpu_oversubscription_is_reported_not_hidden():
    plan = plan_placements(CPU_NODES, 3, use_gpu=False, cpu_per_worker=6)
    assert plan.placements[2].node_id is None and "no node has 6 free CPU" in plan.warnings[0]


@pytest.fixture(scope="module")
def debug_pool(ray_cluster):
    pool = RayResourcePool(num_workers=4, debug_mode=True, cpu_cores_per_worker=0.1, memory_interval=0.5,
                           name="testpool")
    yield pool
    pool.shutdown()


def test_pool_ranks_names_and_instruments(debug_pool):
    assert [identity["rank"] for identity in debug_pool.identities] == [0, 1, 2, 3]
    assert [identity["actor_name"] for identity in debug_pool.identities] == [f"testpool_rank{r}" for r in range(4)]
    for identity in debug_pool.identities:
        assert {"crash_capture", "log_shipping", "memory_watch"} <= set(identity["installed"]), identity
    assert debug_pool.run_all(pool_victims.whoami_rank, timeout=60) == [0, 1, 2, 3]


def test_pool_crash_leaves_a_capsule_with_the_rank(debug_pool, ray_cluster):
    refs = [debug_pool.submit(pool_victims.explode_on_rank_two, 7, rank=rank) for rank in range(4)]
    with pytest.raises(ValueError, match="bad batch 7"):
        ray.get(refs[2], timeout=60)
    assert ray.get(refs[0], timeout=60) == 35
    deadline = time.time() + 30
    capsules = []
    while time.time() < deadline and not capsules:
        capsules = [r for r in open_store(home=ray_cluster.home).query("crash", rank=2)
                    if "bad batch 7" in str(r.data)]
        time.sleep(0.5)
    assert capsules, "no crash capsule for rank 2"
    text = str(capsules[0].data)
    assert "hf_abcdefghijklmnopqrstuvwxyz012345" not in text
    assert capsules[0].pid == debug_pool.identities[2]["pid"]


def test_pool_logs_carry_ranks_and_calls_are_recorded(debug_pool, ray_cluster):
    ray.get([debug_pool.submit(pool_victims.log_line, "hello-pool", rank=rank) for rank in range(4)], timeout=60)
    deadline = time.time() + 30
    ranks = set()
    while time.time() < deadline and ranks != {0, 1, 2, 3}:
        rows = open_store(home=ray_cluster.home).query("log", name="victim.pool")
        ranks = {r.rank for r in rows if "hello-pool" in r.data.get("message", "")}
        time.sleep(0.5)
    assert ranks == {0, 1, 2, 3}
    ref = debug_pool.submit(pool_victims.whoami_rank, rank=1)
    assert ray.get(ref, timeout=60) == 1
    time.sleep(0.5)
    calls = [c for c in debug_pool.calls() if c["function"] == "whoami_rank" and c.get("worker_rank") == 1]
    by_call: dict = {}
    for call in debug_pool.calls():
        by_call.setdefault(call["call_id"], []).append(call["state"])
    lifecycles = [states for states in by_call.values() if states[0] == "submitted"]
    assert any(states == ["submitted", "running", "finished"] for states in lifecycles), by_call
    assert calls
    ran_on = {c["rank"] for c in debug_pool.calls() if c["call_id"] in {s["call_id"] for s in calls}
              and c["state"] in ("running", "finished")}
    assert ran_on == {1}, ran_on  # the worker of rank 1 ran the call submitted to rank 1


def test_gpu_pool_on_cpu_cluster_falls_back(ray_cluster):
    pool = RayResourcePool(num_workers=1, use_gpu=True, cpu_cores_per_worker=0.1, name="gpufallback",
                           start_timeout=60)
    try:
        assert pool.plan.fell_back
        assert any("falling back to a CPU worker" in warning for warning in pool.warnings)
        assert pool.run_all(pool_victims.whoami_rank, timeout=60) == [0]
    finally:
        pool.shutdown()


def test_debug_pool_is_capped(ray_cluster):
    pool = RayResourcePool.for_debugging(num_workers=1, cpu_cores_per_worker=4)
    try:
        assert pool.plan.placements[0].num_cpus == 0.25 and pool.plan.placements[0].num_gpus == 0
    finally:
        pool.shutdown()


def test_instrument_existing_actors(ray_cluster):
    actors = [pool_victims.PlainTrainer.options(name=f"plain_rank{r}").remote(0.5 if r == 3 else 0.0)
              for r in range(4)]
    workers = instrument(actors, timeout=60)
    assert [w.rank for w in workers] == [0, 1, 2, 3]
    assert {w.rank_source for w in workers} == {"actor name"}
    assert all("crash_capture" in w.installed for w in workers)
    # compare, through __ray_call__, names rank 3
    from raysleuth.consistency import compare

    report = compare(actors, lambda trainer: trainer.weights())
    assert not report.consistent
    assert any(3 in mismatch.outlier_ranks for mismatch in report.mismatches)
    # crash capture on a live actor's method
    with pytest.raises(RuntimeError, match="negative batch -5"):
        ray.get(actors[1].update.remote(-5), timeout=60)
    deadline = time.time() + 30
    found = []
    while time.time() < deadline and not found:
        found = [r for r in open_store(home=ray_cluster.home).query("crash", rank=1) if "negative batch -5" in str(r.data)]
        time.sleep(0.5)
    assert found and "sk-live-0123456789abcdef" not in str(found[0].data)
    # stacks label the pids with ranks
    from raysleuth.stacks import dump_stacks

    pids = ray.get([actor.pid.remote() for actor in actors])
    report = dump_stacks(pids=pids, timeout=60)
    ranks = {process.pid: process.rank for process in report.processes}
    assert ranks == dict(zip(pids, [0, 1, 2, 3])), ranks
    for actor in actors:
        ray.kill(actor)
