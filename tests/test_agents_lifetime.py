"""The node agents go once no job that used raysleuth is alive (issue 24: "remove them when the job ends")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from raysleuth.agents.lifetime import Lifetime, wanted

HERE = Path(__file__).parent


def test_agents_are_wanted_while_a_job_of_raysleuths_is_alive_or_evidence_still_arrives():
    assert wanted({"01000000"}, {"01000000", "02000000"}, None, 100.0)
    assert not wanted({"01000000"}, {"02000000"}, None, 100.0)  # another job (not raysleuth's) does not keep them
    assert wanted({"01000000"}, set(), 95.0, 100.0, idle_s=10)  # a detached actor of an ended job still writes
    assert not wanted({"01000000"}, set(), 80.0, 100.0, idle_s=10)
    assert wanted({"01000000"}, None, None, 100.0)  # the job table could not be read: keep them
    assert wanted(set(), set(), None, 100.0)  # no job known yet (a writer just made): as before


def test_the_agents_are_retired_once_after_the_grace_and_come_back_with_the_next_job():
    lifetime = Lifetime(idle_s=10)
    assert lifetime.step(True, 0.0) == "keep"
    assert lifetime.step(False, 1.0) == "wait"
    assert lifetime.step(False, 10.9) == "wait"
    assert lifetime.step(True, 11.0) == "keep"  # wanted again inside the grace: the grace starts over
    assert lifetime.step(False, 12.0) == "wait"
    assert lifetime.step(False, 22.0) == "retire"
    assert lifetime.step(False, 27.0) == "retired"  # once per unwanted spell
    assert lifetime.step(True, 30.0) == "keep"
    assert lifetime.step(False, 31.0) == "wait"


def _run(args: list[str], env: dict[str, str], timeout: float) -> dict:
    done = subprocess.run([sys.executable, "-m", "victims.agents_lifetime", *args], capture_output=True, text=True,
                          env=env, cwd=str(HERE), timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_jobs_agents_stay_while_it_runs_and_go_after_it_ends(tmp_path):
    """A cluster of its own (idle_cluster.py), a job that uses raysleuth on it, then a driver that uses none."""
    temp_dir = tempfile.mkdtemp(prefix="rsal", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env.update({"RAY_AUTH_MODE": "disabled", "RAYSLEUTH_HOME": str(tmp_path / "home"), "RAYSLEUTH_AGENTS_IDLE_S": "3",
                "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent / "src"), env.get("PYTHONPATH", "")])})
    cluster = subprocess.Popen([sys.executable, str(HERE / "victims" / "idle_cluster.py"), temp_dir],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env=env)
    try:
        address = cluster.stdout.readline().split()[0]
        ran = _run(["job", address], env, timeout=240)
        assert ran["made"], "the writer made no agent for a job that uses raysleuth"
        assert ran["while_alive"] == ran["made"], "the agents went while the job that uses them was alive"
        after = _run(["look", address, "60"], env, timeout=180)
        assert after["left"] == [], f"agents still there {after['after_s']}s after the job ended: {after['left']}"
        assert after["writer"]["agents_retired"] == len(ran["made"]), after["writer"]
    finally:
        cluster.stdin.close()
        try:
            cluster.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cluster.kill()
