"""The node agent's file readers, on real files in a temporary folder (no Ray)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

from raysleuth.agents.host import worker_logs
from raysleuth.agents.ranks import thread_times


def test_worker_logs_outside_a_ray_process_say_what_is_missing():
    """No logs folder given and none from Ray: an error per pid, not a TypeError (mypy found it)."""
    assert worker_logs([4242]) == {4242: {"error": "no Ray session logs folder in this process: pass logs_dir"}}


def test_worker_logs_read_the_tail_of_the_pids_files(tmp_path):
    (tmp_path / "worker-abc-01000000-4242.err").write_text("one\ntwo\nthree\n")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "worker-abc-01000000-4243.out").write_text("gone\n")
    found = worker_logs([4242, 4243, 4244], lines=2, logs_dir=str(tmp_path))
    assert found[4242] == {"err": ["two", "three"]}
    assert found[4243] == {"out": ["gone"]}
    assert "no worker log for pid 4244" in found[4244]["error"]


def test_thread_counters_say_when_a_thread_waits_on_the_disk():
    """``ranks.thread_times`` reads each thread's state: a process that writes and ``fsync``s in a loop (as a
    checkpoint does) is found in the kernel's wait on a device (``disk_wait`` 1.0, state D) at some read, one that
    sleeps never is. The verdict counts a thread in D that woke over the window as making progress."""
    with tempfile.TemporaryDirectory() as folder:
        code = ("import os, sys\nblock = os.urandom(8 << 20)\nwhile True:\n"
                f"    with open({folder + '/ckpt.bin'!r}, 'wb') as handle:\n"
                "        handle.write(block)\n        handle.flush()\n        os.fsync(handle.fileno())\n")
        writer = subprocess.Popen([sys.executable, "-c", code])
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; print('asleep', flush=True); time.sleep(60)"],
                                   stdout=subprocess.PIPE)
        try:
            sleeper.stdout.readline()  # started: reads from here on find it asleep
            seen: dict[int, set[float]] = {writer.pid: set(), sleeper.pid: set()}
            deadline = time.monotonic() + 30
            while 1.0 not in seen[writer.pid] and time.monotonic() < deadline:
                for pid, threads in thread_times([writer.pid, sleeper.pid]).items():
                    seen[pid] |= {counters["disk_wait"] for counters in threads.values()}
                time.sleep(0.002)
        finally:
            writer.kill()
            sleeper.kill()
            writer.wait()
            sleeper.wait()
    assert 1.0 in seen[writer.pid], seen
    assert seen[sleeper.pid] == {0.0}, seen
