"""The node agent's file readers, on real files in a temporary folder (no Ray)."""

from __future__ import annotations

from raysleuth.agents.host import worker_logs


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
