"""Evidence survives a prompt exit; two jobs on one cluster stay apart; every reader names its run (issue 17)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raysleuth.recorder import RecordClient, choose_run, deliver_spooled, spool
from raysleuth.recorder.store import MIGRATIONS, SCHEMA_VERSION, EvidenceStore, open_run

HERE = Path(__file__).parent
ROOT = HERE.parent


class HangingSink:
    """A writer that never answers (gone, or stuck)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def deliver(self, header, rows):
        self.release.wait()
        raise ConnectionError("writer gone")


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_close_spools_first_and_never_hangs_the_exit(tmp_path):
    sink = HangingSink()
    client = RecordClient(sink, interval=0.01, run_id="run-a", spool_dir=tmp_path / "spool" / "run-a")
    for n in range(40):
        client.record("log", {"n": n}, level="WARNING")
    time.sleep(0.1)  # the background thread now holds a batch in flight, stuck in the sink
    start = time.monotonic()
    assert client.close(timeout=0.5) is False
    assert time.monotonic() - start < 2.0  # bounded: the user's exit is not held
    handed = sorted((tmp_path / "spool" / "run-a").glob("*-closed-*.jsonl"))
    # the spool and the write-ahead file, named so the writer and the CLI know no live client will send them
    assert [path.name.endswith(".wal.jsonl") for path in handed] == [False, True]
    store = open_run(tmp_path, "run-a")
    assert spool.ingest_spools(tmp_path, store, "run-a") == 40
    assert sorted(r.data["n"] for r in store.query("log")) == list(range(40))  # each once
    assert not any(path.exists() for path in handed)
    sink.release.set()


def test_a_spool_of_a_process_that_is_gone_becomes_its_own_run_for_readers(tmp_path):
    previous = open_run(tmp_path, "old-run")
    previous.add("log", {"message": "the previous job"})
    previous.close()  # closed by the cyclic collector otherwise (sqlite3's statement cache holds the connection):
    folder = spool.spool_dir(tmp_path, "new-run")  # its last write could then come after the spool's
    path = folder / f"{os.uname().nodename}-{_dead_pid()}-abc.jsonl"
    spool.append(path, {"client_id": "abc", "job_id": "05000000", "pid": 1}, [
        ["log", time.time(), 2, None, None, "train", "ERROR", {"message": "rank 2 error"}, 0],
    ])
    live = folder / f"{os.uname().nodename}-{os.getpid()}-live.jsonl"  # a live client sends its own
    spool.append(live, {"client_id": "live"}, [["log", time.time(), 0, None, None, "t", "INFO", {}, 0]])
    choice = choose_run(home=tmp_path)
    assert (choice.run_id, choice.reason) == ("new-run", "newest")  # not the previous job's run
    assert "new-run" in choice.describe() and "newest" in choice.describe()
    store = EvidenceStore(choice.path, readonly=True)
    records = store.query("log")
    assert [(r.rank, r.job_id, r.data["message"]) for r in records] == [(2, "05000000", "rank 2 error")]
    assert live.exists() and not path.exists()
    assert deliver_spooled(tmp_path) == 0  # nothing twice


def test_a_run_recorded_before_job_ids_is_migrated_or_read_as_it_is(tmp_path):
    path = tmp_path / "runs" / "v1" / "evidence.sqlite"
    path.parent.mkdir(parents=True)
    db = sqlite3.connect(path)
    db.executescript("BEGIN;" + MIGRATIONS[0] + "; PRAGMA user_version=1; COMMIT;")
    db.execute("INSERT INTO records (kind, time, data) VALUES ('log', 1.0, '{}')")
    db.commit()
    db.close()
    reader = EvidenceStore(path, readonly=True)
    assert reader.schema_version == 1
    assert len(reader.query("log")) == 1 and reader.query("log")[0].job_id is None
    assert reader.query("log", job="02000000") == [] and reader.jobs() == {}
    reader.close()
    writer = EvidenceStore(path)
    assert writer.schema_version == SCHEMA_VERSION == 10
    writer.write_batch({"client_id": "c", "job_id": "03000000"}, [["log", 2.0, 1, None, None, "n", "INFO", {}, 0]])
    assert [r.job_id for r in writer.query("log")] == [None, "03000000"]
    assert writer.jobs() == {"03000000": 1}


def test_every_reading_command_names_its_run_on_stderr(tmp_path):
    open_run(tmp_path, "only-run").add("log", {"message": "hello"}, level="INFO")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    for command in (["logs"], ["logs", "--json"], ["crashes"], ["timeline", "--summary"]):
        done = subprocess.run([sys.executable, "-m", "raysleuth", *command, "--home", str(tmp_path)],
                              capture_output=True, text=True, env=env, timeout=120)
        assert "run only-run (the newest run" in done.stderr, (command, done.stderr)
    done = subprocess.run([sys.executable, "-m", "raysleuth", "logs", "--json", "--home", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(done.stdout)[0]["message"] == "hello"  # stdout stays clean JSON


# ------------------------------------------------------------------ live Ray

REPEATS = int(os.environ.get("RAYSLEUTH_PROMPT_EXIT_REPEATS", "2"))


def _run_drivers(address: str, home: Path, drivers: int, repeats: int) -> list[str]:
    env = dict(os.environ, RAYSLEUTH_HOME=str(home),
               PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-m", "victims.prompt_exit", address, "--repeats", str(repeats)],
                              cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(drivers)]
    jobs = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        jobs += [line.split()[1] for line in out.splitlines() if line.startswith("JOB ")]
    return jobs


def test_prompt_exit_keeps_every_record_and_concurrent_jobs_stay_apart(ray_cluster):
    """4 ranks log 3 warnings + 1 error, the driver calls ray.shutdown() at once: 16 of 16 kept, per job."""
    from raysleuth import cluster
    from raysleuth.recorder import open_store

    jobs = _run_drivers(ray_cluster.address, ray_cluster.home, drivers=2, repeats=REPEATS)
    assert len(set(jobs)) == 2 * REPEATS
    deadline = time.monotonic() + 60
    while True:
        store = open_store()  # this process is connected: its cluster's run
        per_job = {job: store.query("log", job=job, name="victims.prompt_exit") for job in jobs}
        store.close()
        if all(len(records) == 16 for records in per_job.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert {job: len(records) for job, records in per_job.items()} == {job: 16 for job in jobs}
    for records in per_job.values():
        for rank in range(4):
            mine = [r for r in records if r.rank == rank]
            assert sorted(r.level for r in mine) == ["ERROR", "WARNING", "WARNING", "WARNING"]
            assert all(f"rank {rank} " in r.data["message"] for r in mine)
    # --job keeps two jobs on one cluster apart on the command line too
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    run = cluster.session_name()
    done = subprocess.run([sys.executable, "-m", "raysleuth", "logs", "--job", jobs[0], "--rank", "1", "--json",
                           "--run", run, "--home", str(ray_cluster.home)], capture_output=True, text=True, env=env,
                          timeout=120)
    lines = json.loads(done.stdout)
    assert len(lines) == 4 and {line["job_id"] for line in lines} == {jobs[0]}
    assert {line["rank"] for line in lines} == {1}
    assert f"run {run} (--run)" in done.stderr


def test_a_warning_survives_a_hard_kill_right_after_it_is_logged(tmp_path):
    """Ray may end a finished job's actor with a force kill (no Python runs): urgent records are on disk first."""
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(ROOT / 'src')!r})
from raysleuth.recorder import RecordClient

class Nowhere:
    def deliver(self, header, rows):
        raise ConnectionError("no writer yet")

client = RecordClient(Nowhere(), interval=60, run_id="run-k", spool_dir={str(tmp_path / 'spool' / 'run-k')!r})
client.record("log", {{"message": "debug detail"}}, level="INFO")
for n in range(3):
    client.record("log", {{"message": f"warning {{n}}"}}, level="WARNING")
client.record("log", {{"message": "the error"}}, level="ERROR")
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run([sys.executable, "-c", script], timeout=120)
    assert done.returncode == -9
    store = open_run(tmp_path, "run-k")
    spool.ingest_spools(tmp_path, store, "run-k")
    kept = sorted(r.data["message"] for r in store.query("log"))
    assert kept == ["the error", "warning 0", "warning 1", "warning 2"]


class _EndsInsideRay:
    """As the writer sink: a delivery is a call into Ray, and this one ends the process the way Ray's QuickExit
    does when the core worker is gone (at once, no Python exit)."""

    CALLS_RAY = True

    def deliver(self, header, rows):
        os.kill(os.getpid(), signal.SIGKILL)


class _LeavingRank:
    """A Ray actor whose records are being delivered when its process ends."""

    def record_and_end(self, spool_dir: str) -> None:
        client = RecordClient(_EndsInsideRay(), interval=60, run_id="run-f", spool_dir=Path(spool_dir))
        for n in range(3):
            client.record("log", {"message": f"info {n}"}, level="INFO")  # not urgent: never written ahead
        client.nudge()
        time.sleep(60)


def test_a_batch_being_delivered_through_ray_survives_the_process_ending_inside_that_call(ray_cluster, tmp_path):
    """A Ray worker leaving on its own destroys its core worker before Python's exit; a call into Ray from then
    on ends the process at once. The batch a delivery is sending is on disk (the flight file) before the call."""
    import ray

    leaving = ray.remote(num_cpus=0, max_restarts=0)(_LeavingRank).remote()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(leaving.record_and_end.remote(str(tmp_path / "spool" / "run-f")), timeout=120)
    store = open_run(tmp_path, "run-f")
    assert spool.ingest_spools(tmp_path, store, "run-f") == 3
    assert sorted(r.data["message"] for r in store.query("log")) == ["info 0", "info 1", "info 2"]
    assert not list((tmp_path / "spool" / "run-f").glob("*.jsonl"))  # each file was taken once stored


def _logged(home: Path, name: str, wanted: int, timeout: float = 60.0) -> list:
    from raysleuth.errors import StoreNotFound
    from raysleuth.recorder import open_store

    deadline = time.monotonic() + timeout
    while True:
        try:
            store = open_store()
        except StoreNotFound:  # run alone: nothing has reached this run's store yet
            records = []
        else:
            records = store.query("log", name=name)
            store.close()
        if len(records) >= wanted or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def test_an_actor_that_exits_or_is_killed_at_once_keeps_its_evidence(ray_cluster):
    """exit (Ray runs Python's exit): every record; ray.kill (Ray runs nothing): WARNING and above."""
    import ray

    from victims.chatty_ranks import ChattyRank

    Chatty = ray.remote(num_cpus=0)(ChattyRank)
    # Three leave through exit_actor and one when its handle goes out of scope: each exit races the delivery the
    # WARNING started (before the fix, about one exit in four lost its INFO on a loaded machine).
    leaving = [Chatty.remote(rank, 12, "victims.exit_graceful") for rank in (5, 7, 9, 11)]
    killed = Chatty.remote(6, 8, "victims.exit_killed")
    for actor in (*leaving, killed):
        ray.get([actor.train_step.remote(1, 0.5), actor.warn.remote("about to go")], timeout=120)
    for actor in leaving[:3]:
        actor.__ray_terminate__.remote()  # the actor's own exit, right after logging
    del actor
    leaving = leaving[:3]  # the last one's only handle is gone: Ray ends it gracefully
    ray.kill(killed)  # no Python runs in the killed process
    graceful = _logged(ray_cluster.home, "victims.exit_graceful", 8)
    assert sorted((r.rank, r.level) for r in graceful) == [
        (rank, level) for rank in (5, 7, 9, 11) for level in ("INFO", "WARNING")]
    hard = _logged(ray_cluster.home, "victims.exit_killed", 1)
    assert [r.level for r in hard if r.level == "WARNING"] == ["WARNING"]  # written ahead, then ingested
