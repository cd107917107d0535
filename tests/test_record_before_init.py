"""A process that records before ``ray.init`` delivers what it records afterwards to its cluster's run.

Before the fix, the first record made the process client a local-run client
for good: every later record of a script that logged before connecting (and
of the test suite's driver) went to a ``local`` run nobody reads.
"""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = r"""
import sys, ray, raysleuth as rs
log = rs.get_logger("before-init")
log.warning("said before ray.init")
ray.init(address=sys.argv[1], log_to_driver=False)
log.warning("said after ray.init")
rs.event("after-init-event", marker=1)
assert rs.flush(20)
print(ray.get_runtime_context().get_job_id())
"""


def test_records_after_ray_init_reach_the_cluster_run(ray_cluster):
    from raysleuth.recorder import open_store

    env = {**os.environ, "RAYSLEUTH_HOME": str(ray_cluster.home)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, ray_cluster.address], capture_output=True, text=True,
                          env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    job = done.stdout.strip().splitlines()[-1]
    store = open_store(home=ray_cluster.home)  # this test process's cluster: the same run
    try:
        logs = [r.data.get("message") for r in store.query("log", name="before-init")]
        events = [r for r in store.query("event", name="after-init-event") if r.job_id == job]
    finally:
        store.close()
    assert "said after ray.init" in logs, logs
    assert events, "the event recorded after ray.init did not reach the cluster's run"
