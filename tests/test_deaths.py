"""Why did rank N die? Real deaths on the real 2-node test cluster, each classified with its rank.

Ranks come from where real jobs put them: ``RANK`` in the actor's
``runtime_env`` (DDP-in-actors) or a verl-style actor name. The victims have
no raysleuth inside. One module fixture kills every rank once; each test
checks one death, then the faces (tasks --dead, crashes, explain, advise, report).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from own_cluster import run_victim


def _wait_for_capsule(tag: str, timeout: float = 60.0) -> None:
    from raysleuth.recorder import open_store

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            store = open_store()
            try:
                if any(tag in record.data.get("message", "") for record in store.query("crash")):
                    return
            finally:
                store.close()
        except Exception:
            pass
        time.sleep(0.3)


@pytest.fixture(scope="module")
def deaths(ray_cluster):
    import ray

    from raysleuth.deaths import find_deaths, record_deaths
    from victims import dying_workers as dw
    from victims.crashing_actor import RemoteOverCapture

    tag = uuid.uuid4().hex[:6]
    worker_node, head = ray_cluster.worker_node_id, ray_cluster.head_node_id
    workers = {
        0: dw.start(0, 8, node_id=worker_node),
        1: dw.start(1, 8, name=f"{tag}WorkerDict_0:1", env=False, node_id=head),  # verl: rank only in the name
        2: dw.start(2, 8, node_id=worker_node),
        3: dw.start(3, 8, node_id=head),
        4: dw.start(4, 8, node_id=worker_node),
    }
    failing = dw.start(5, 8, fail_in_init=True, node_id=head)
    ray.get([worker.step.remote() for worker in workers.values()], timeout=180)
    task = ray.remote(max_retries=0)(dw.preprocess_shard).options(name=f"preprocess_{tag}").remote(7)
    calls = [workers[0].sigkill.remote(), workers[1].segfault.remote(), workers[2].abort.remote(),
             workers[3].exit_early.remote(3)]
    ray.kill(workers[4])
    for call in calls:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(call, timeout=120)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(failing.pid.remote(), timeout=120)
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        ray.get(task, timeout=120)
    crashing = RemoteOverCapture.remote(6)  # @rs.capture_crashes: its exception leaves a capsule
    with pytest.raises(RuntimeError):
        ray.get(crashing.step.remote(1, tag), timeout=120)
    _wait_for_capsule(tag)
    ray.kill(crashing)  # what a controller does to a worker group after one rank raised
    ids = {rank: handle._actor_id.hex() for rank, handle in {**workers, 5: failing, 6: crashing}.items()}
    deadline = time.time() + 60
    while True:  # Ray records a death a moment after the caller sees it
        report = find_deaths()
        found = {death.actor_id: death for death in report.deaths}
        tasks = [death for death in report.deaths if death.task == f"preprocess_{tag}"]
        if (all(actor_id in found for actor_id in ids.values()) and tasks) or time.time() > deadline:
            break
        time.sleep(1)
    assert record_deaths(report) >= len(ids)
    return {"by_rank": {rank: found.get(actor_id) for rank, actor_id in ids.items()}, "report": report, "ids": ids,
            "home": ray_cluster.home, "task": tasks[0] if tasks else None}


def test_sigkill_is_classified_with_its_rank_and_what_was_read(deaths):
    death = deaths["by_rank"][0]
    assert death.rank == 0 and death.rank_source == "runtime_env" and death.world_size == 8
    assert death.cause in ("sigkill", "oom_killer") and death.signal == "SIGKILL"
    assert death.cause == "sigkill", death.evidence  # this machine's kernel log is readable and has no OOM kill
    assert any("kernel log" in line or "no OOM record" in line for line in death.evidence)
    assert any("step 1" in line for line in death.last_stdout)


def test_segfault_names_the_python_function_and_the_verl_rank(deaths):
    death = deaths["by_rank"][1]
    assert death.rank == 1 and death.rank_source == "actor name"
    assert death.cause == "fatal_signal" and death.signal == "SIGSEGV"
    assert death.function == "read_native_buffer" and death.file.endswith("dying_workers.py")


def test_abort(deaths):
    death = deaths["by_rank"][2]
    assert (death.rank, death.cause, death.signal, death.function) == (2, "fatal_signal", "SIGABRT", "abort")


def test_sys_exit_3_in_an_actor_method(deaths):
    death = deaths["by_rank"][3]
    assert (death.rank, death.cause, death.exit_code) == (3, "exit", 3)
    assert any("exiting with 3" in line for line in death.last_stdout)


def test_ray_kill(deaths):
    death = deaths["by_rank"][4]
    assert (death.rank, death.cause) == (4, "ray_kill")


def test_exception_in_init(deaths):
    death = deaths["by_rank"][5]
    assert (death.rank, death.cause, death.exception_type) == (5, "init_failed", "FileNotFoundError")
    assert "rank 5" in death.exception_message


def test_python_exception_then_ray_kill_names_the_exception(deaths):
    death = deaths["by_rank"][6]
    assert (death.rank, death.rank_source) == (6, "registered")
    assert death.cause == "python_exception" and death.exception_type == "RuntimeError"
    assert any("ray.kill" in line for line in death.evidence)


def test_a_task_worker_that_died_is_classified_too(deaths):
    death = deaths["task"]
    workers = [(d.task, d.cause, d.pid) for d in deaths["report"].deaths if d.actor_id is None]
    assert death is not None and death.actor_id is None, workers
    assert (death.cause, death.signal, death.function) == ("fatal_signal", "SIGSEGV", "read_native_buffer")
    assert any("preprocessing shard 7" in line for line in death.last_stdout)


def test_tasks_dead_cli_gives_rank_cause_and_evidence(deaths, capsys):
    from raysleuth.cli import main

    capsys.readouterr()
    assert main(["tasks", "--dead", "--json", "--no-record"]) == 1
    payload = json.loads(capsys.readouterr().out)
    mine = {item["actor_id"]: item for item in payload["deaths"] if item["actor_id"] in deaths["ids"].values()}
    segfault = mine[deaths["ids"][1]]
    assert segfault["rank"] == 1 and segfault["cause"] == "fatal_signal" and segfault["function"] == "read_native_buffer"
    dead_actor = next(item for item in payload["dead_actors"] if item["actor_id"] == deaths["ids"][0])
    assert dead_actor["cause"] == "sigkill" and dead_actor["rank"] == 0 and dead_actor["evidence"]
    assert dead_actor["ray_reason"] == "WORKER_DIED"  # Ray's own reason, kept beside the classified one
    assert main(["tasks", "--dead", "--no-record"]) == 1
    out = capsys.readouterr().out
    assert "fatal_signal" in out and "read_native_buffer" in out and "rank 1" in out


def test_crashes_lists_deaths_beside_capsules_from_the_store(deaths, capsys):
    from raysleuth.cli import main

    from raysleuth.deaths import record_deaths

    assert record_deaths(deaths["report"]) == 0  # each death is recorded once
    capsys.readouterr()
    main(["crashes", "--json", "--home", str(deaths["home"])])
    listed = json.loads(capsys.readouterr().out)
    recorded = {item["actor_id"]: item for item in listed if item["kind"] == "death"}
    assert len([item for item in listed if item.get("actor_id") == deaths["ids"][3]]) == 1
    assert recorded[deaths["ids"][3]]["cause"] == "exit" and recorded[deaths["ids"][3]]["rank"] == 3
    death_id = recorded[deaths["ids"][1]]["id"]
    assert main(["crashes", "show", str(death_id), "--home", str(deaths["home"])]) == 0
    assert "read_native_buffer" in capsys.readouterr().out


def test_explain_names_rank_and_cause_of_the_actor_in_the_text(deaths, capsys):
    from raysleuth.cli import main

    death = deaths["by_rank"][0]
    text = ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
            f"\tclass_name: Worker\n\tactor_id: {death.actor_id}\n\tpid: {death.pid}\n"
            "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR")
    capsys.readouterr()
    assert main(["explain", "--json", text]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["deaths"][0]["rank"] == 0 and payload["deaths"][0]["cause"] == "sigkill"
    assert payload["matches"][0]["id"] == "worker-died-unexpectedly"


def test_advise_branches_on_the_recorded_causes(deaths, capsys):
    from raysleuth.cli import main

    capsys.readouterr()
    assert main(["advise", "--problem", "crash", "--from-run", "--json", "--home", str(deaths["home"])]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert {"fatal_signal", "sigkill", "exit"} <= set(advice["causes"])
    assert any("PYTHONFAULTHANDLER" in step["run"] for step in advice["steps"])
    assert not any("RAY_memory_usage_threshold" in step["run"] for step in advice["steps"])


def test_report_crash_section_shows_deaths(deaths, tmp_path):
    from raysleuth import evidence
    from raysleuth.recorder import open_store
    from raysleuth.report import sections

    store = open_store(home=deaths["home"])
    try:
        records = evidence.read(store, evidence.Death)
    finally:
        store.close()
    entries = [entry for entry in sections.crash_section(records) if entry.get("kind") == "death"]
    segfault = next(entry for entry in entries if entry["rank"] == 1 and "fatal_signal" in entry["exception"])
    assert segfault["where"] == "read_native_buffer" and "Fatal Python error" in segfault["traceback"]


def test_memory_monitor_kill_on_its_own_cluster(tmp_path):
    """Ray's memory monitor, forced with a threshold just above this machine's current use."""
    result = run_victim("memory_monitor_death", tmp_path, timeout=400)
    assert result["outcome"] != "survived", result
    death = result["deaths"][0]
    assert death["rank"] == 0 and death["cause"] == "memory_monitor", death
    assert any(user["command"].startswith("ray::Worker") for user in death["top_memory_users"])
