"""The death classifier on evidence saved from real deaths (tests/data/deaths/), without Ray.

Each JSON file is what :func:`raysleuth.deaths.collect.gather` read for one
real death on a local Ray 2.60 cluster (``python -m victims.save_death_evidence``):
the State API's actor/worker/task rows and the tails of the worker's logs.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from raysleuth.deaths.classify import (
    CAUSES,
    DeathEvidence,
    classify,
    exit_code,
    init_exception,
    memory_monitor_report,
    parse_fatal,
)
from raysleuth.labels.dead import env_rank, ray_train_ranks, store_ranks

DATA = Path(__file__).parent / "data" / "deaths"


def evidence(name: str) -> DeathEvidence:
    return DeathEvidence(**json.loads((DATA / f"{name}.json").read_text()))


def test_sigkill_without_oom_record_says_what_was_read():
    verdict = classify(evidence("sigkill"))
    assert verdict.cause == "sigkill" and verdict.signal == "SIGKILL"
    assert any("no fatal-signal output" in line for line in verdict.evidence)
    assert any("kernel log read: no OOM kill" in line for line in verdict.evidence)


def test_segfault_names_the_python_function_it_was_in():
    verdict = classify(evidence("segfault"))
    assert verdict.cause == "fatal_signal" and verdict.signal == "SIGSEGV"
    assert verdict.function == "read_native_buffer"
    assert verdict.file.endswith("victims/dying_workers.py")
    assert verdict.stack[0]["function"] == "string_at"  # the innermost frame is ctypes' own


def test_abort_is_a_fatal_signal_in_the_method():
    verdict = classify(evidence("abort"))
    assert (verdict.cause, verdict.signal, verdict.function) == ("fatal_signal", "SIGABRT", "abort")


def test_sys_exit_3_gives_the_code_and_last_line():
    verdict = classify(evidence("sys_exit_3"))
    assert verdict.cause == "exit" and verdict.exit_code == 3
    assert any("exiting with 3" in line for line in verdict.evidence)


def test_ray_kill_says_ray_does_not_record_the_caller():
    verdict = classify(evidence("ray_kill"))
    assert verdict.cause == "ray_kill" and verdict.ray_reason == "RAY_KILL"
    assert any("does not record which process called ray.kill" in line for line in verdict.evidence)


def test_init_failure_gives_the_exception():
    verdict = classify(evidence("init_failed"))
    assert verdict.cause == "init_failed"
    assert verdict.exception_type == "FileNotFoundError" and "rank 6" in verdict.exception_message
    assert verdict.function == "__init__"


def test_init_failure_whose_handle_was_dropped_is_not_guessed():
    # Ray then records REF_DELETED and the creation task as WORKER_DIED: no exception evidence survives.
    verdict = classify(evidence("init_failed_handle_dropped"))
    assert verdict.cause == "out_of_scope"


def test_memory_monitor_kill_names_the_top_users():
    verdict = classify(evidence("memory_monitor"))
    assert verdict.cause == "memory_monitor" and verdict.ray_reason == "OUT_OF_MEMORY"
    assert verdict.top_memory_users[0]["command"] == "ray::Worker.allocate"
    assert any(line.startswith("Ray: OOM kill reason") for line in verdict.evidence)


def test_kernel_oom_record_for_the_pid_decides_oom_killer():
    found = evidence("sigkill")
    pid = found.actor.pid
    found.oom = {"kernel_log": {"permitted": True, "kills": [
        {"pid": pid, "name": "ray::Worker", "text": f"Out of memory: Killed process {pid} (ray::Worker) "
                                                    "total-vm:9000000kB, anon-rss:8000000kB"}]},
                 "cgroup": {"oom_kill": 1, "limit_bytes": 8 * 2**30}}
    verdict = classify(found)
    assert verdict.cause == "oom_killer"
    assert any(f"Killed process {pid}" in line for line in verdict.evidence)


def test_another_pids_kernel_oom_record_does_not_count():
    found = evidence("sigkill")
    found.oom = {"kernel_log": {"permitted": True, "kills": [{"pid": 1, "text": "Killed process 1 (x)"}]}}
    assert classify(found).cause == "sigkill"


def test_cgroup_oom_count_with_samples_near_the_limit_decides_oom_killer():
    found = evidence("sigkill")
    found.oom = {"kernel_log": {"permitted": False, "reason": "Operation not permitted", "kills": []},
                 "cgroup": {"path": "/sys/fs/cgroup/job", "oom_kill": 2, "limit_bytes": 4 * 2**30}}
    found.memory_samples = [{"time": 1.0, "rss_bytes": int(3.9 * 2**30)}]
    verdict = classify(found)
    assert verdict.cause == "oom_killer"
    assert any("counted 2 OOM kill" in line for line in verdict.evidence)


def test_kernel_log_not_permitted_is_said_not_guessed():
    found = evidence("sigkill")
    found.oom = {"kernel_log": {"permitted": False, "reason": "Operation not permitted", "kills": []},
                 "cgroup": {"oom_kill": 0, "limit_bytes": 4 * 2**30}}
    verdict = classify(found)
    assert verdict.cause == "sigkill"
    assert "could not be ruled out" in verdict.summary
    assert any("no OOM record readable on this node (kernel log not permitted" in line for line in verdict.evidence)


def test_dead_node_decides_node_death():
    found = evidence("sigkill")
    found.node_alive = False
    assert classify(found).cause == "node_died"


def test_capsule_decides_python_exception_over_a_plain_exit():
    found = evidence("sys_exit_3")
    died = found.worker.end_time_ms / 1000
    found.capsules = [{"id": 7, "time": died - 2, "exception_type": "ValueError", "message": "bad shard",
                       "method": "Worker.step"}]
    verdict = classify(found)
    assert verdict.cause == "python_exception" and verdict.exception_type == "ValueError"
    found.capsules[0]["time"] = died - 3600  # an exception handled an hour before is not why it died
    assert classify(found).cause == "exit"


def test_fatal_file_is_read_when_the_log_has_nothing():
    found = evidence("sigkill")
    found.fatal_file = ("# raysleuth fatal-signal file pid=1 rank=3 actor_id=- job_id=-\n"
                        + "\n".join(evidence("segfault").err_lines))
    verdict = classify(found)
    assert verdict.cause == "fatal_signal" and verdict.function == "read_native_buffer"
    assert verdict.evidence[0].startswith("raysleuth fatal-signal file")


def test_parse_fatal_reads_pythons_own_faulthandler_output():
    code = "import ctypes, faulthandler\nfaulthandler.enable()\ndef peek():\n    ctypes.string_at(0)\npeek()\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    fatal = parse_fatal(done.stderr)
    assert fatal.signal == "SIGSEGV" and fatal.user_function == "peek" and fatal.frames


def test_small_parsers():
    assert exit_code("Worker exits with an exit code 3.") == 3 and exit_code("End of file") is None
    assert init_exception("Traceback...\nKeyError: 'lr'\n") == ("KeyError", "'lr'")
    report = memory_monitor_report("was 5.0GB used / 10.0GB limit\nTop 10 memory users:\nPID\tMEM(GB)\tCOMMAND\n"
                                   "42\t3.50\tray::Actor.step\n\nRefer to...")
    assert report["node_used_gb"] == 5.0 and report["top_users"] == [
        {"pid": 42, "memory_gb": 3.5, "command": "ray::Actor.step"}]
    assert set(CAUSES) >= {"sigkill", "oom_killer", "fatal_signal", "memory_monitor", "ray_kill", "exit",
                           "node_died", "init_failed", "python_exception"}


def test_rank_sources():
    assert env_rank({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}) == {"rank": 3, "world_size": 8,
                                                                              "local_rank": 1}
    assert env_rank({"WORLD_SIZE": "8"}) == {}
    train = ray_train_ranks((DATA / "ray-train-sys-worker.log").read_text().splitlines())
    assert list(train.values())[0]["rank"] == 1 and list(train.values())[0]["pid"] == 10063

    class Rec:
        def __init__(self, rank, actor_id, pid, node_ip="10.0.0.1"):
            self.rank, self.actor_id, self.pid, self.node_ip = rank, actor_id, pid, node_ip

    by_actor, by_pid = store_ranks([Rec(2, "a1", 11), Rec(None, "a2", 12), Rec(5, None, 13)])
    assert by_actor == {"a1": 2} and by_pid == {("10.0.0.1", 11): 2, ("10.0.0.1", 13): 5}


@pytest.mark.parametrize("name", ["sigkill", "segfault", "abort", "sys_exit_3", "ray_kill", "init_failed",
                                  "memory_monitor"])
def test_every_verdict_carries_evidence(name):
    verdict = classify(copy.deepcopy(evidence(name)))
    assert verdict.cause in CAUSES and verdict.evidence and all(verdict.evidence)


def test_peers_say_who_beat_again_after_the_death():
    from raysleuth.deaths import _peers

    beats = {0: {"step": 41, "time": 90.0}, 1: {"step": 42, "time": 120.0}, 2: {"step": 41, "time": 95.0}}
    peers = {peer["rank"]: peer for peer in _peers(2, 100.0, beats)}
    assert peers[2]["self"] and "beat_after_death" not in peers[2]
    assert peers[0]["beat_after_death"] is False and peers[1]["beat_after_death"] is True
    assert _peers(0, None, {}) == []


def test_fatal_file_header_gives_the_rank():
    from raysleuth.deaths.parse import fatal_file_rank

    assert fatal_file_rank("# raysleuth fatal-signal file pid=12 rank=3 actor_id=- job_id=01000000\n") == 3
    assert fatal_file_rank("# raysleuth fatal-signal file pid=12 rank=- actor_id=- job_id=-\n# rank=5\n") == 5
    assert fatal_file_rank("# raysleuth fatal-signal file pid=12 rank=- actor_id=- job_id=-\n") is None


def test_node_agent_reads_ray_train_ranks_from_the_logs_folder(tmp_path):
    from raysleuth.agents import ray_train_lines

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "ray-train-sys-worker-abc.log").write_text((DATA / "ray-train-sys-worker.log").read_text())
    ranks = ray_train_ranks(ray_train_lines(50, logs_dir=str(tmp_path)))
    assert [entry["rank"] for entry in ranks.values()] == [1]
    assert ray_train_lines(50, logs_dir=str(tmp_path / "missing")) == []


# ------------------------------------------------------------------ kernel OOM kills: pid, time, name


def _killed(found: DeathEvidence, *, pid: int, at: float, name: str = "ray::Worker", **kernel) -> DeathEvidence:
    found.oom = {"kernel_log": {"permitted": True, **kernel, "kills": [
        {"pid": pid, "name": name, "time": at,
         "text": f"Out of memory: Killed process {pid} ({name}) total-vm:9000000kB, anon-rss:8000000kB"}]},
        "cgroup": {"oom_kill": 1, "limit_bytes": 8 * 2**30}}
    return found


def test_a_kernel_kill_at_the_death_beats_an_exception_handled_before_it():
    """An actor outlives its method's exception (a capsule 60 s before); then the kernel OOM-kills it."""
    found = evidence("sigkill")
    died = found.worker.end_time_ms / 1000
    found.capsules = [{"id": 7, "time": died - 60, "exception_type": "ValueError", "message": "bad batch",
                       "method": "Worker.step"}]
    verdict = classify(_killed(found, pid=found.actor.pid, at=died - 1))
    assert verdict.cause == "oom_killer", verdict
    assert any("crash capsule 7 recorded ValueError" in line for line in verdict.evidence)


def test_an_old_kill_of_a_reused_pid_or_another_command_is_not_this_death():
    found = evidence("sigkill")
    died, pid = found.worker.end_time_ms / 1000, found.actor.pid
    verdict = classify(_killed(found, pid=pid, at=died - 3600))
    assert verdict.cause == "sigkill" and any("a reused pid" in line for line in verdict.evidence), verdict
    verdict = classify(_killed(evidence("sigkill"), pid=pid, at=died, name="stress-ng"))
    assert verdict.cause == "sigkill" and any("'stress-ng', not as this worker" in line for line in verdict.evidence)
    assert classify(_killed(evidence("sigkill"), pid=pid, at=died, name="ray::Worker.sig")).cause == "oom_killer"


def test_a_kernel_log_in_another_pid_namespace_is_said_and_matched_by_name_and_time():
    nested = {"same_as_kernel_log": False, "levels": 2, "detail": "a nested pid namespace"}
    found = evidence("sigkill")
    died = found.worker.end_time_ms / 1000
    verdict = classify(_killed(found, pid=987654, at=died - 2, pid_namespace=nested))  # a host pid
    assert verdict.cause == "oom_killer" and any("matched by command name and time" in line
                                                  for line in verdict.evidence), verdict
    same_pid = _killed(evidence("sigkill"), pid=found.actor.pid, at=died - 2, name="ray::Other", pid_namespace=nested)
    verdict = classify(same_pid)  # the same number, but a host pid of another process
    assert verdict.cause == "sigkill" and "could not be ruled out" in verdict.summary
    assert any("another pid namespace" in line for line in verdict.evidence)


def test_dmesg_lines_are_read_with_their_time_and_old_ones_left_out():
    from raysleuth.agents.host import oom_evidence, parse_kernel_kills

    text = ("[  100.250000] Out of memory: Killed process 3117 (ray::Worker) total-vm:9000000kB, anon-rss:8000000kB\n"
            "[  900.500000] oom-kill:constraint=CONSTRAINT_NONE,task=ray::Trainer,pid=42,uid=0\n"
            "[  900.500001] Out of memory: Killed process 42 (ray::Trainer) total-vm:1kB\n"
            "[  901.000000] eth0: link up\n")
    kills = parse_kernel_kills(text, booted_at=1_000_000.0)
    assert [(k["pid"], k["name"], k["time"]) for k in kills] == [(3117, "ray::Worker", 1_000_100.25),
                                                                  (42, "ray::Trainer", 1_000_900.500001)]
    assert [k["pid"] for k in parse_kernel_kills(text, booted_at=1_000_000.0, since=1_000_800.0)] == [42]
    assert parse_kernel_kills(text, booted_at=None, since=1e12)[0]["time"] is None  # no clock: kept, time unknown
    here = oom_evidence(since=0.0)["kernel_log"]  # this machine's real kernel log and pid namespace
    assert here["pid_namespace"]["same_as_kernel_log"] in (True, False, None)
    assert here["permitted"] or here["reason"]


def test_every_documented_cause_is_a_typed_cause_and_back():
    import typing

    from raysleuth.deaths.causes import CAUSES, Cause

    assert set(typing.get_args(Cause)) == set(CAUSES)
