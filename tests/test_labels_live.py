"""Rank resolution from outside (labels.live, agents.rank_hints): pure precedence, real files, real processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from raysleuth.agents import rank_hints, read_train_logs
from raysleuth.agents import AgentResult
from raysleuth.labels.live import hints_from_results, merge_hints, resolve_rank

DATA = Path(__file__).parent / "data" / "ray_train_logs"


def test_sources_most_specific_first():
    train = {"rank": 1, "local_rank": 1, "world_size": 2}
    env = {"RANK": "4", "WORLD_SIZE": "8", "LOCAL_RANK": "0"}
    named = {"rank": 3, "rank_source": "actor name"}
    registered = {"rank": 7, "rank_source": "registered", "world_size": 9}
    assert resolve_rank(registered, {"train": train, "environment": env})["rank_source"] == "registered"
    assert resolve_rank(named, {"train": train, "environment": env})["rank"] == 1  # Ray Train beats the env
    got = resolve_rank(named, {"environment": env})
    assert (got["rank"], got["rank_source"], got["world_size"], got["local_rank"]) == (4, "environment", 8, 0)
    assert resolve_rank(named, {"environment": {**env, "WG_PREFIX": "abc"}})["rank_source"] == "verl environment"
    assert resolve_rank(named, {"environment": {}})["rank_source"] == "actor name"
    # a registered rank without world size takes it from the environment
    assert resolve_rank({"rank": 4, "rank_source": "registered"}, {"environment": env})["world_size"] == 8


def test_unreadable_environment_is_a_note_not_an_error():
    got = resolve_rank({}, {"environment": None, "note": "start-up environment not readable (access denied)"})
    assert got["rank"] is None and got["rank_source"] is None and "access denied" in got["rank_note"]
    assert resolve_rank({}, {"environment": {"RANK": "not a number"}})["rank_source"] is None


def test_merge_never_gives_a_driver_a_rank():
    labels = {("10.0.0.1", 5): {"pid": 5, "node_ip": "10.0.0.1", "rank": 1, "rank_source": "registered"}}
    hints = {"10.0.0.1": {5: {"environment": {"RANK": "1"}}, 6: {"environment": {"RANK": "2"}}}}
    merged = merge_hints(labels, hints, drivers={("10.0.0.1", 5)})
    assert merged[("10.0.0.1", 5)]["rank"] is None and merged[("10.0.0.1", 5)]["role"] == "driver"
    assert (merged[("10.0.0.1", 6)]["rank"], merged[("10.0.0.1", 6)]["rank_source"]) == (2, "environment")


def test_two_nodes_on_one_machine_keep_both_nodes_workers():
    head = AgentResult("n1", "10.0.0.1", True, {"processes": {"5": {"environment": {"RANK": "0"}}}, "seconds": 0.004})
    worker = AgentResult("n2", "10.0.0.1", True, {"processes": {"6": {"environment": {"RANK": "1"}}}, "seconds": 0.007})
    lost = AgentResult("n3", "10.0.0.3", False, error="timed out")
    hints, notes, costs = hints_from_results([head, worker, lost])
    assert sorted(hints["10.0.0.1"]) == [5, 6] and costs["10.0.0.1"] == 0.007
    assert "timed out" in notes["10.0.0.3"]


def test_ray_train_structured_logs(tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(DATA, logs)
    found = read_train_logs(str(logs))
    # the real lines of a 2-worker TorchTrainer run: pid -> world rank, local rank, world size
    assert {pid: (e["rank"], e["local_rank"], e["world_size"]) for pid, e in found.items()} == {
        12879: (1, 1, 2), 12854: (0, 0, 2)}
    assert found[12879]["run_name"].startswith("ray_train_run-")
    cache: dict = {}
    read_train_logs(str(logs), cache)
    assert len(cache) == 2  # read once; the next call reads no file
    (logs / "train" / "ray-train-sys-worker-broken.log").write_text("not json\n")
    assert set(read_train_logs(str(logs), cache)) == {12879, 12854}
    assert read_train_logs(None) == {} and read_train_logs(str(tmp_path / "nowhere")) == {}


def test_start_up_environment_of_another_process():
    env = {**os.environ, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "SECRET_TOKEN": "x"}
    child = subprocess.Popen([sys.executable, "-c", "import os, time; os.environ['RANK'] = '99'; time.sleep(30)"],
                             env=env)
    try:
        time.sleep(0.3)
        started = time.perf_counter()
        hints = rank_hints([child.pid, 999_999_999])["processes"]
        assert time.perf_counter() - started < 0.5
        # the start-up environment, not what the process set later; only the rank variables
        assert hints[child.pid]["environment"] == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
        assert hints[999_999_999]["environment"] is None and "exited" in hints[999_999_999]["note"]
    finally:
        child.kill()
        child.wait()


def test_environment_denied_to_another_user():
    """An agent that runs as another user cannot read the environment: rank_source null and a note."""
    import json

    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    target = os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the reader, as user nobody
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, json.dumps(rank_hints([target])["processes"]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as handle:
        text = handle.read()
    os.waitpid(child, 0)
    hint = json.loads(text)[str(target)]
    assert hint["environment"] is None and "access denied" in hint["note"]
    assert resolve_rank({}, hint)["rank_source"] is None


def test_death_reason_and_creation_env_of_dead_actors():
    """Shapes as Ray 2.60's State API returns them for a SIGKILLed actor and a ray.kill'ed one."""
    from raysleuth.cluster import runtime_env_vars, death_reason

    killed = {"death_cause": {"actor_died_error_context": {
        "error_message": "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
                         "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. "
                         "Some common causes include: (1) the process was killed by the OOM killer",
        "reason": "WORKER_DIED", "pid": 16024}},
        "serialized_runtime_env": '{"env_vars": {"RANK": "1", "WORLD_SIZE": "3"}}'}
    text, on_purpose = death_reason(killed)
    assert not on_purpose and text.startswith("WORKER_DIED: its worker process has died")
    assert "Some common causes" not in text
    assert runtime_env_vars(killed) == {"RANK": "1", "WORLD_SIZE": "3"}
    stopped = {"death_cause": {"actor_died_error_context": {"reason": "RAY_KILL",
                                                            "error_message": "The actor was killed by ray.kill()"}}}
    assert death_reason(stopped)[1] is True
    assert death_reason({})[0] == "died (no cause recorded)" and runtime_env_vars({"serialized_runtime_env": "x"}) == {}
