"""Victim: an idle ``ray.init()`` beside the real job (what a notebook left running does).

Run as a script with its own Ray temp dir as the only argument; prints the
GCS address and the session name on one line, then keeps the cluster up until
its stdin closes.
"""

import socket
import sys

import ray

with socket.socket() as probe:  # other clusters on this machine may hold 8265
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
ray.init(address="local", num_cpus=1, include_dashboard=True, dashboard_port=port, logging_level="ERROR",
         _temp_dir=sys.argv[1])
context = ray.get_runtime_context()
print(context.gcs_address, context.get_session_name(), flush=True)
sys.stdin.read()
