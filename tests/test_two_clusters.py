"""Two Ray clusters on one machine: one deterministic choice, named, with the others listed (issue 29).

Other clusters (other test sessions) may be alive on this machine too: the
tests assert on the two clusters they know, never on the total count.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from raysleuth.cluster import LocalCluster, local_clusters
from raysleuth.cluster.discovery import choose_address

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def idle_cluster():
    """A second, idle ``ray.init()`` cluster with its own temp dir, beside the session's cluster."""
    temp_dir = tempfile.mkdtemp(prefix="rs2c", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"
    proc = subprocess.Popen([sys.executable, str(HERE / "victims" / "idle_cluster.py"), temp_dir],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    line = proc.stdout.readline().split()
    assert len(line) == 2, "the idle cluster did not start"
    yield line[0], line[1]
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def _cli(args, *, env_extra=None):
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "raysleuth", *args], capture_output=True, text=True, env=env,
                          timeout=180)


def test_choice_is_pure_and_deterministic():
    old = LocalCluster(address="10.0.0.1:6379", session_name="session_a", temp_dir=None, started=1.0)
    new = LocalCluster(address="10.0.0.1:6380", session_name="session_b", temp_dir=None, started=2.0)
    picked = choose_address(None, env={}, current=None, clusters=[old, new])
    assert picked.address == new.address and picked.others == [old] and "newest" in picked.reason
    current = choose_address(None, env={}, current=old.address, clusters=[old, new])
    assert current.address == old.address and current.others == [new] and "ray_current_cluster" in current.reason
    from_env = choose_address(None, env={"RAY_ADDRESS": new.address}, current=old.address, clusters=[old, new])
    assert from_env.address == new.address and from_env.reason == "RAY_ADDRESS"
    assert choose_address(old.address, env={"RAY_ADDRESS": new.address}, clusters=[old, new]).address == old.address
    notice = picked.notice()
    assert "2 Ray clusters" in notice and f"--address {old.address} (session_a)" in notice
    assert choose_address(None, env={}, clusters=[old]).notice() is None
    assert choose_address(None, env={}, clusters=[]).address is None


def test_two_clusters_named_and_listed(ray_cluster, idle_cluster):
    idle_address, idle_session = idle_cluster
    alive = {item.address: item for item in local_clusters()}
    assert idle_address in alive and alive[idle_address].session_name == idle_session
    assert ray_cluster.address in alive
    # No --address: one choice, the same on every call, and every other live cluster listed with its --address.
    runs = [_cli(["tasks", "--dead", "--no-record", "--json"]) for _ in range(2)]
    notices = [next(line for line in done.stderr.splitlines() if "Ray clusters on this machine" in line)
               for done in runs]
    assert notices[0].split("; others")[0] == notices[1].split("; others")[0], notices
    for address in (idle_address, ray_cluster.address):
        assert address in notices[0], notices[0]
    chosen = notices[0].split("using ", 1)[1].split(" ", 1)[0]
    header = next(line for line in runs[0].stderr.splitlines() if line.startswith("cluster "))
    assert header.startswith(f"cluster {chosen} · session "), runs[0].stderr
    # --address: that cluster, named with its session in the header.
    done = _cli(["tasks", "--dead", "--no-record", "--json", "--address", idle_address])
    assert done.returncode == 0, done.stderr
    assert f"cluster {idle_address} · session {idle_session}" in done.stderr, done.stderr
