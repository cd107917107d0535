"""A SIGKILLed rank outlives its job: recorded while the cluster lived, read after it is gone (issue 29).

An unmodified gloo DDP job runs under `raysleuth run` on its own cluster;
rank 2 is SIGKILLed mid-training (as the kernel OOM killer does: no output),
its peers fail in gloo ("Connection reset/closed by peer"), the job ends and
its cluster with it. Then, from the store alone: the dead rank comes first,
classified, and the peers' errors are listed as its consequences.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from zero_code_run import SRC, run_job


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    job = run_job("zero_code_ddp.py", "--world-size", "4", "--steps", "5", "--fail-step", "2", "--fail-rank", "-1",
                  "--kill-rank", "2", tmp=tmp_path_factory.mktemp("killed"))
    yield job
    shutil.rmtree(job.ray_tmp, ignore_errors=True)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAYSLEUTH_", "RAY_ADDRESS"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "raysleuth", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_the_killed_rank_is_read_after_the_cluster_is_gone(killed):
    assert killed.returncode == 1, killed.stderr[-3000:]  # the job's own failure
    done = _cli("crashes", "--json", "--home", str(killed.home))  # the cluster is gone: the store is final
    assert done.returncode == 1, done.stderr
    items = json.loads(done.stdout)
    first = items[0]
    assert first["kind"] == "death" and first["rank"] == 2 and first["cause"] in ("sigkill", "oom_killer"), items
    peers = [item for item in items if item["kind"] == "capsule"]
    assert peers and {item["rank"] for item in peers} <= {0, 1, 3}, items
    assert all(item["consequence_of"] and item["consequence_of"]["rank"] == 2 for item in peers), peers
    table = _cli("crashes", "--home", str(killed.home))
    assert "consequence of rank 2's death" in table.stdout and table.stdout.index("rank 2") < table.stdout.index(
        "consequence of"), table.stdout
    dead = _cli("tasks", "--dead", "--run", "latest", "--home", str(killed.home), "--json")
    assert dead.returncode == 1, dead.stderr
    assert [death["rank"] for death in json.loads(dead.stdout)["deaths"]][:1] == [2]
    explained = _cli("explain", peers[0]["message"], "--json")
    assert json.loads(explained.stdout)["matches"][0]["id"] == "gloo-peer-died", explained.stdout


def test_a_watch_not_answered_yet_is_pending_then_installed_not_an_error(ray_cluster):
    """A writer slow to answer (a loaded node) leaves the worker's death watch pending: the setup's record says
    so, no error, and a control tick records it installed once the answer comes (the request is not sent again)."""
    import ray

    from raysleuth.deaths import watch
    from raysleuth.worker_setup import worker

    @ray.remote
    def slow_answer():
        time.sleep(4)
        return True

    saved, was_started = dict(worker._state), watch._started.is_set()
    watch._started.clear()
    watch._asked[:] = [slow_answer.remote()]  # the install call in flight, answering in 4 s
    try:
        worker._state.update(installed=[], errors=[], pending=[], started=time.monotonic(), timings_ms={})
        worker._attempt("death_watch", lambda: watch.start_death_watch(wait=0.5))
        assert worker._state["pending"] == ["death_watch"] and worker._state["errors"] == []
        assert worker._late_parts() is False  # still in flight: no error, still pending
        deadline = time.monotonic() + 60
        while not worker._late_parts():
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert worker._state["installed"] == ["death_watch"] and worker._state["errors"] == []
        assert watch._started.is_set() and watch._asked == []
        from raysleuth import cluster, evidence
        from raysleuth.recorder import get_client, open_store

        get_client().flush(timeout=10)
        store = open_store(cluster.session_name(), home=ray_cluster.home)
        try:
            late = [event for event in evidence.read(store, evidence.Instrumented)
                    if event.late and event.row.pid == os.getpid()]
        finally:
            store.close()
        outcomes = [(event.installed, list(event.errors), event.row.level) for event in late]
        assert outcomes == [(("death_watch",), [], "INFO")]
    finally:
        worker._state.clear()
        worker._state.update(saved)
        watch._asked.clear()
        if not was_started:  # the writer was never asked here: the next caller must ask it
            watch._started.clear()


def test_the_writer_records_a_death_while_the_cluster_lives(ray_cluster):
    """No `tasks --dead` is run: the writer's watch alone classifies and stores the SIGKILLed rank."""
    import ray

    from polling import poll
    from raysleuth.deaths import stored_deaths
    from raysleuth.deaths.watch import start_death_watch
    from victims.dying_workers import start

    assert start_death_watch()
    worker = start(6, 8, name="watched_rank6")
    pid = ray.get(worker.pid.remote(), timeout=60)
    actor_id = worker._actor_id.hex()  # noqa: SLF001 (the test's own handle)
    worker.sigkill.remote()

    def recorded():
        return next((death for death in stored_deaths() if death.actor_id == actor_id), None)

    death = poll(recorded, timeout=60)
    assert death is not None, "the writer's watch did not record the death"
    assert death.rank == 6 and death.pid == pid and death.cause in ("sigkill", "oom_killer"), death


_OWNER = """
import ray, sys
ray.init(address=sys.argv[1])
from victims.dying_workers import start
worker = start(4, 8, name="orphaned_rank4")
print(ray.get(worker.pid.remote(), timeout=60), worker._actor_id.hex(), flush=True)
"""


def test_a_rank_torn_down_with_its_driver_is_owner_died_not_sys_exit(ray_cluster):
    """Ray says the owner died (exit type INTENDED_USER_EXIT): that is not the worker calling sys.exit."""
    from polling import poll
    from raysleuth.deaths import find_deaths

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC.parent / "tests"), str(SRC),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _OWNER, ray_cluster.address], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    actor_id = done.stdout.split()[-1]

    def classified():
        return next((d for d in find_deaths(ray_cluster.address).deaths if d.actor_id == actor_id), None)

    death = poll(classified, timeout=60)
    assert death is not None and death.cause == "owner_died", death
    assert "on purpose" not in death.summary and "sys.exit" not in (death.fix or "")
