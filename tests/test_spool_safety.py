"""The spool is bounded and streamed, SIGTERM mid-write exits promptly, evidence files are private (issue 24)."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from raysleuth.recorder import RecordClient, StoreSink, spool
from raysleuth.recorder.store import open_run

ROOT = Path(__file__).parent.parent


class Down:
    """The writer out of reach."""

    def deliver(self, header, rows):
        raise ConnectionError("writer down")


class Counting(StoreSink):
    """A real store that remembers the size of every batch it was given."""

    def __init__(self, store) -> None:
        super().__init__(store)
        self.batches: list[int] = []

    def deliver(self, header, rows):
        self.batches.append(len(rows))
        super().deliver(header, rows)


def test_the_spool_is_capped_counts_what_it_dropped_and_records_the_count(tmp_path):
    cap = 64 * 1024
    client = RecordClient(Down(), batch_size=500, interval=60, run_id="capped", spool_max_bytes=cap,
                          spool_dir=tmp_path / "spool" / "capped")
    for n in range(5000):
        client.record("log", {"n": n, "message": "x" * 40})
    assert client.flush(timeout=10) is False
    assert client.spool_path.stat().st_size <= cap + 4096  # the cap, plus the drop notes
    kept, dropped = client.stats.spooled, client.stats.dropped
    assert kept + dropped == 5000 and dropped > 4000 and kept > 100
    store = open_run(tmp_path, "capped")
    client.sink = Counting(store)
    client.close(timeout=10)
    assert len(store.query("log")) == kept
    notes = store.query("event", name="spool_dropped")
    assert notes and all(r.level == "WARNING" for r in notes)
    assert sum(r.data["dropped_rows"] for r in notes) == dropped
    assert notes[0].data["cap_bytes"] == cap and "lost" in notes[0].data["message"]
    assert max(client.sink.batches) <= 500  # read back in the client's batches


def test_a_large_spool_is_read_back_in_bounded_batches(tmp_path):
    folder = tmp_path / "spool" / "big"
    header = {"client_id": "c" * 16, "pid": 1}
    rows = [["log", 1.0, 0, None, None, "n", "INFO", {"message": "y" * 200}, n] for n in range(40_000)]
    path = folder / "host-1-client.jsonl"
    for start in range(0, len(rows), 5000):
        spool.append(path, header, rows[start:start + 5000], max_bytes=1 << 30)
    assert path.stat().st_size > 8_000_000
    sizes = []
    tracemalloc.start()
    try:
        for _header, batch in spool.iter_spool(path, batch=1000):
            sizes.append(len(batch))
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(sizes) == 40_000 and max(sizes) <= 1000
    assert peak < 3_000_000, f"read back whole: {peak} bytes at peak for an {path.stat().st_size} byte file"


SIGTERM_MID_WRITE = r"""
import os, signal, sys, time
sys.path.insert(0, {src!r})
from raysleuth.recorder import RecordClient, process

class Down:
    def deliver(self, header, rows):
        raise ConnectionError("writer down")

class SignalsWhileSerialised:
    # json.dumps calls repr() here, inside the write-ahead's lock: the signal lands mid-write
    def __repr__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs now, in this thread
        return "<payload>"

client = RecordClient(Down(), interval=60, run_id="run-t", spool_dir={folder!r})
process.reset_client(client)
process._client_pid = os.getpid()
process._save_on_sigterm()
for n in range(5):
    client.record("log", {{"message": f"warning {{n}}"}}, level="WARNING")
client.record("log", {{"message": "mid-write", "payload": SignalsWhileSerialised()}}, level="ERROR")
time.sleep(30)
print("not terminated")
"""


def test_sigterm_delivered_mid_write_exits_promptly_and_loses_nothing(tmp_path):
    """A real SIGTERM lands inside the write-ahead's lock; the handler's save must not wait for that lock."""
    folder = tmp_path / "spool" / "run-t"
    script = SIGTERM_MID_WRITE.format(src=str(ROOT / "src"), folder=str(folder))
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=25)
    except subprocess.TimeoutExpired:
        raise AssertionError("SIGTERM during a write-ahead deadlocked the exit") from None
    assert done.returncode == -15, (done.returncode, done.stdout, done.stderr[-2000:])
    assert time.monotonic() - started < 20
    store = open_run(tmp_path, "run-t")
    spool.ingest_spools(tmp_path, store, "run-t")
    kept = sorted(r.data["message"] for r in store.query("log"))
    assert kept == ["mid-write"] + [f"warning {n}" for n in range(5)]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_run_folders_and_files_are_private_whatever_the_umask(tmp_path):
    home = tmp_path / "home"
    old = os.umask(0)
    try:
        store = open_run(home, "private")
        store.add("log", {"message": "secret locals"})
        client = RecordClient(Down(), interval=60, run_id="private",
                              spool_dir=spool.node_spool_dir(home, "private", "a" * 32))
        client.record("log", {"message": "urgent"}, level="WARNING")
        client.record("log", {"message": "queued"})
        client.flush(timeout=5)
        wal = client._files.wal.path
        spooled = client.spool_path
        assert wal.exists() and spooled.exists()
        files = [home / "runs" / "private" / "evidence.sqlite", home / "runs" / "latest", wal, spooled]
        files += [path for path in (home / "runs" / "private").iterdir() if path.name.endswith(("-wal", "-shm"))]
        assert len(files) >= 5
        for path in files:
            assert _mode(path) == 0o600, f"{path} is {oct(_mode(path))}"
        folders = [home, home / "runs", home / "runs" / "private", home / "spool", home / "spool" / "private",
                   spooled.parent]
        for folder in folders:
            assert _mode(folder) == 0o700, f"{folder} is {oct(_mode(folder))}"
        client.close(timeout=0.2)
        store.close()
    finally:
        os.umask(old)


@contextlib.contextmanager
def _a_process_and_its_spool(tmp_path, run: str):
    """A live child process, and an empty spool file in the run's folder named as that process's client's."""
    folder = spool.node_spool_dir(tmp_path, run, None)
    folder.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = folder / f"{socket.gethostname()}-{child.pid}-c1.jsonl"
        path.write_text("")
        yield child, path
    finally:
        child.kill()
        child.wait()


def test_a_spool_whose_pid_now_names_a_younger_process_is_abandoned(tmp_path):
    """pids wrap within minutes on a busy node: a dead writer's pid given to a new process must not keep its
    spool "alive" (its records were never delivered). The writer itself, alive and older, keeps its file."""
    with _a_process_and_its_spool(tmp_path, "run-p") as (_stranger, reused):
        old = time.time() - 10  # last written 10 s before the stranger started
        os.utime(reused, (old, old))
        owner = reused.with_name(f"{socket.gethostname()}-{os.getppid()}-c2.jsonl")  # alive since before the file
        owner.write_text("")
        found = spool.abandoned(tmp_path, "run-p", [None])
        assert reused in found and owner not in found


def test_a_spool_whose_writer_was_killed_and_not_yet_reaped_is_abandoned(tmp_path):
    """A Ray worker ended with SIGKILL is a zombie until its raylet waits for it, and the driver hears of the
    death first: its pid still answers a signal, but its files must be taken (the CI once read nothing here)."""
    with _a_process_and_its_spool(tmp_path, "run-z") as (writer, left):
        writer.kill()
        deadline = time.monotonic() + 10
        while open(f"/proc/{writer.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":  # not waited for
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(writer.pid, 0)  # the pid still answers: the case this test is about
        assert left in spool.abandoned(tmp_path, "run-z", [None])
