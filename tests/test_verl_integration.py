"""raysleuth on verl's real single controller (CPU): ranks, hangs, crashes."""

import json
import time

import pytest
import ray

verl_ray = pytest.importorskip("verl.single_controller.ray", reason="verl is not installed (pip install 'raysleuth[verl]')")

from raysleuth.integrations import verl as rs_verl  # noqa: E402
from raysleuth.recorder import open_store  # noqa: E402


def test_parse_worker_name():
    assert rs_verl.parse_worker_name("abc123ActorRolloutRefWorker_0:3") == {
        "prefix_class": "abc123ActorRolloutRefWorker", "placement_group": 0, "local_rank": 3}
    assert rs_verl.parse_worker_name("trainer_rank1") is None


@pytest.fixture(scope="module")
def worker_group(ray_cluster):
    from victims.verl_victims import ToyWorker

    pool = verl_ray.RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1)
    group = verl_ray.RayWorkerGroup(pool, verl_ray.RayClassWithInitArgs(cls=ray.remote(ToyWorker)),
                                    device_name="cpu", name_prefix="rstest")
    yield group
    for handle in group.workers:
        ray.kill(handle)


@pytest.fixture(scope="module")
def instrumented(worker_group):
    instrumentation = rs_verl.instrument(worker_group)
    yield instrumentation
    instrumentation.close()


def test_ranks_follow_verl(worker_group, instrumented):
    assert [w.rank for w in instrumented.workers] == [0, 1]
    assert [r["rank"] for r in worker_group.ping()] == [0, 1]
    names = [rs_verl.parse_worker_name(name)["local_rank"] for name in worker_group.worker_names]
    assert names == [0, 1]
    assert all("crash_capture" in w.installed for w in instrumented.workers)


def test_crash_in_a_verl_method_leaves_a_capsule_with_the_verl_rank(worker_group, instrumented, ray_cluster):
    with pytest.raises(FloatingPointError, match="loss is nan on rank 1"):
        worker_group.update_actor(1)
    deadline = time.time() + 60
    capsules = []
    while time.time() < deadline and not capsules:
        capsules = [r for r in open_store(home=ray_cluster.home).query("crash", rank=1) if "loss is nan" in str(r.data)]
        time.sleep(0.5)
    assert capsules, "no capsule for rank 1"
    assert "update_actor" in (capsules[0].name or "") + str(capsules[0].data.get("method"))
    assert "ghp_abcdefghijklmnopqrstuvwxyz" not in str(capsules[0].data)


def test_hung_rank_is_named_with_its_method(worker_group, instrumented, ray_cluster, capsys):
    refs = worker_group.generate_sequences(1, 40)  # non-blocking: rank 1 sleeps 40 s
    deadline = time.time() + 20
    stuck = []
    while time.time() < deadline:
        stuck = instrumented.outstanding(older_than=2)
        if stuck and all(call.rank == 1 for call in stuck):
            break
        time.sleep(0.3)
    assert [(call.rank, call.method) for call in stuck] == [(1, "generate_sequences")]
    from raysleuth.stacks import dump_stacks

    report = dump_stacks(pids=instrumented.pids(), timeout=60)
    by_rank = {process.rank: process for process in report.processes}
    assert set(by_rank) == {0, 1}

    def in_method(process):  # py-spy names methods Class.method
        return any(frame.function.rsplit(".", 1)[-1] == "generate_sequences"
                   for thread in process.threads for frame in thread.frames)

    assert in_method(by_rank[1])
    assert not in_method(by_rank[0])
    # The same answer from outside the driver: `raysleuth stacks` reads the verl_call evidence.
    from raysleuth.cli import main
    from raysleuth.recorder import get_client

    get_client().flush(timeout=10)
    pid_args = [arg for pid in instrumented.pids() for arg in ("--pid", str(pid))]
    capsys.readouterr()
    main(["stacks", "--address", ray_cluster.address, *pid_args, "--json", "--no-record", "--timeout", "60"])
    unreturned = json.loads(capsys.readouterr().out)["unreturned_calls"]
    assert [(call["rank"], call["method"]) for call in unreturned] == [(1, "generate_sequences")]
    # ... and `raysleuth watch` treats a call that has not returned for --stall seconds as a stall.
    code = main(["watch", "--address", ray_cluster.address, "--stall", "3", "--duration", "15", "--json",
                 "--home", str(ray_cluster.home), "--timeout", "60"])
    event = json.loads(capsys.readouterr().out)
    assert code == 1, event
    assert "rank 1 has not returned from generate_sequences" in event["summary"]
    assert [r["rank"] for r in event["stalled"]] == [1] and event["stalled"][0]["pid"] == instrumented.pids()[1]
    assert ray.get(refs, timeout=60) == [0, 1]
    time.sleep(0.5)
    assert instrumented.outstanding() == []
    rows = open_store(home=ray_cluster.home).query("verl_call", name="generate_sequences")
    states = {(r.rank, r.data["state"]) for r in rows}
    assert {(0, "submitted"), (1, "submitted"), (0, "returned"), (1, "returned")} <= states
