"""The two direct ways in, on a real cluster with a dashboard: no `raysleuth run`.

- ``ray job submit --runtime-env-json '{"worker_process_setup_hook": "raysleuth.setup_worker"}' -- python job.py``
  on a job with no raysleuth in it;
- ``ray.init(runtime_env={"worker_process_setup_hook": "raysleuth.setup_worker"})`` in the job.

Each job's failing task must leave a capsule in the cluster's run. The
cluster is this module's own, in its own temp root (``RAY_TMPDIR``): Ray's
job supervisor finds "its" cluster through ``<temp>/ray/ray_current_cluster``,
which on a machine shared with other clusters would name someone else's.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from zero_code_run import SRC, short_tmp

from raysleuth.recorder import open_store

VICTIMS = Path(__file__).resolve().parent / "victims"
HOOK_JSON = json.dumps({"worker_process_setup_hook": "raysleuth.setup_worker"})
RAY_CLI = Path(sys.executable).with_name("ray")

CLUSTER_SCRIPT = """
import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 2, "include_dashboard": True, "dashboard_port": int(sys.argv[1]),
    "dashboard_agent_listen_port": int(sys.argv[2])})
print(cluster.address, flush=True)
sys.stdin.read()  # until the test closes our stdin
cluster.shutdown()
"""


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: every probe stays bound until all are chosen (one at a time, the kernel
    may hand the same port out twice: CI once got the dashboard's port again for the agent's)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


@pytest.fixture(scope="module")
def dashboard_cluster(tmp_path_factory):
    home, ray_tmp = tmp_path_factory.mktemp("direct") / "home", short_tmp()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAYSLEUTH_", "RAY_ADDRESS"))}
    env.update(RAY_TMPDIR=str(ray_tmp), RAYSLEUTH_HOME=str(home), RAY_raylet_start_wait_time_s="180",
               PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]))
    dashboard_port, agent_port = _free_ports(2)
    process = subprocess.Popen([sys.executable, "-c", CLUSTER_SCRIPT, str(dashboard_port), str(agent_port)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    address = process.stdout.readline().strip()
    assert address, "the cluster did not start"
    yield {"address": address, "dashboard": f"http://127.0.0.1:{dashboard_port}", "home": home, "env": env}
    process.stdin.close()
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _capsules(home: Path, name: str, timeout: float = 120.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        runs = list((home / "runs").glob("*/evidence.sqlite"))
        found = open_store(str(runs[0]), home=home).query("crash", name=name) if runs else []
        if found or time.monotonic() > deadline:
            return found
        time.sleep(1)


@pytest.mark.skipif(not RAY_CLI.exists(), reason="the ray command line is not installed")
def test_ray_job_submit_with_the_setup_hook(dashboard_cluster):
    command = [str(RAY_CLI), "job", "submit", "--address", dashboard_cluster["dashboard"],
               "--runtime-env-json", HOOK_JSON, "--", sys.executable, str(VICTIMS / "zero_code_etl.py")]
    deadline = time.monotonic() + 180
    while True:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dashboard_cluster["env"])
        if "No available agent" not in done.stderr or time.monotonic() > deadline:
            break
        time.sleep(3)  # the node's job agent is still starting (a loaded machine)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "skipped a record: KeyError: 'text'" in done.stdout
    assert "parsed lengths: [5, 6]" in done.stdout  # the job's own result, unchanged
    capsules = _capsules(dashboard_cluster["home"], "parse_record")
    runs = list((dashboard_cluster["home"] / "runs").glob("*/evidence.sqlite"))
    seen = [(r.kind, r.name, r.pid) for r in open_store(str(runs[0])).query()] if runs else "no run"
    assert capsules, f"no capsule from the submitted job's worker; the run has {seen}"
    capsule = capsules[-1].data
    assert capsule["exception_type"] == "KeyError"
    frame = next(f for f in capsule["frames"] if f.get("function", "").endswith("parse_record"))
    assert frame["locals"]["db_password"] == "<redacted>"


def test_ray_init_with_the_setup_hook(dashboard_cluster):
    env = dict(dashboard_cluster["env"], RAY_ADDRESS=dashboard_cluster["address"])
    done = subprocess.run([sys.executable, str(VICTIMS / "setup_hook_in_code.py")], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipped a record: KeyError: 'text'" in done.stdout
    capsules = _capsules(dashboard_cluster["home"], "tokenize_record")
    assert capsules and capsules[-1].data["exception_type"] == "KeyError"
