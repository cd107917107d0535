"""Victim: a rank whose node dies, on its own two-node cluster.

``python -m victims.node_death`` starts a ``ray.cluster_utils.Cluster``
(head + one worker node), places rank 1 (RANK in its runtime_env) on the
worker node, removes that node (its raylet and workers are killed, as when
a machine is lost), then prints ``raysleuth.deaths.find_deaths()`` for that
actor as JSON on the last line. Run it with its own RAYSLEUTH_HOME.
"""

from __future__ import annotations

import json
import socket
import time


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster

    from victims import dying_workers

    with socket.socket() as probe:  # other clusters on this machine may hold the default dashboard port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": True,
                                                            "dashboard_port": port})
    doomed = cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        cluster.wait_for_nodes()
        node_id = next(node["NodeID"] for node in ray.nodes()
                       if node["Alive"] and node["NodeManagerAddress"] and node["NodeID"] != ray.get_runtime_context().get_node_id())
        worker = dying_workers.start(1, 2, node_id=node_id)
        ray.get(worker.step.remote(), timeout=180)
        cluster.remove_node(doomed, allow_graceful=False)
        try:
            ray.get(worker.step.remote(), timeout=120)
            outcome = "answered"  # the orphaned worker may answer once before it notices
        except Exception as error:
            outcome = type(error).__name__
        deadline = time.time() + 60
        from raysleuth.deaths import find_deaths

        while True:
            report = find_deaths()
            mine = [death.to_dict() for death in report.deaths if death.actor_id == worker._actor_id.hex()]
            if mine or time.time() > deadline:
                break
            time.sleep(1)
        print(json.dumps({"outcome": outcome, "deaths": mine, "warnings": report.warnings}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
