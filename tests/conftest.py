"""Shared fixtures: one real 2-node Ray cluster for the whole test session.

``ray_cluster`` starts a ``ray.cluster_utils.Cluster`` (a head node and one
worker node, both on this machine, dashboard on) and connects the test
process to it as the driver. RAYSLEUTH_HOME points at a temporary folder
before Ray starts, so workers inherit it. Tests that need no Ray don't ask
for the fixture and run without it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # victims/ importable as a package by tests and Ray workers


@dataclass
class RayCluster:
    """The running test cluster."""

    address: str
    home: Path
    head_node_id: str
    worker_node_id: str
    cluster: object


@pytest.fixture(scope="session")
def raysleuth_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("raysleuth_home")
    os.environ["RAYSLEUTH_HOME"] = str(home)
    from raysleuth import runtime

    runtime.reload_settings()
    return home


@pytest.fixture(scope="session")
def ray_cluster(raysleuth_home) -> RayCluster:
    import ray
    from ray.cluster_utils import Cluster

    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(HERE.parent / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    import socket

    with socket.socket() as probe:  # other clusters on this machine may hold 8265
        probe.bind(("127.0.0.1", 0))
        dashboard_port = probe.getsockname()[1]
    # A loaded 2-core machine can take longer than Ray's 30 s to register a raylet.
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "180")
    # The shared cluster runs this session's job and many short victim jobs: its writer (inheriting this) keeps
    # the node agents for the session rather than retiring them between two tests that use them; the agents'
    # retirement has its own cluster in tests/test_agents_lifetime.py.
    os.environ.setdefault("RAYSLEUTH_AGENTS_IDLE_S", "86400")
    # Its writer seals memory samples into blocks every 64 (not 32,768): every job here that records memory is
    # then read back through the blocks, and each memory test checks them on a real cluster.
    os.environ.setdefault("RAYSLEUTH_SEAL_ROWS", "64")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "include_dashboard": True,
                                                            "dashboard_port": dashboard_port})
    cluster.add_node(num_cpus=8)
    ray.init(address=cluster.address, log_to_driver=False)
    deadline = time.time() + 60
    while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.time() < deadline:
        time.sleep(0.2)
    from raysleuth import cluster as rs_cluster

    nodes = rs_cluster.nodes(alive_only=True)
    head = next(n.node_id for n in nodes if n.is_head_node)
    worker = next(n.node_id for n in nodes if not n.is_head_node)
    yield RayCluster(address=cluster.address, home=raysleuth_home, head_node_id=head, worker_node_id=worker,
                     cluster=cluster)
    from raysleuth.recorder import reset_client

    old = reset_client(None)
    if old is not None:
        old.close()
    ray.shutdown()
    cluster.shutdown()
