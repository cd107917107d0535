"""Victim: a local Ray cluster with token authentication, for connection tests.

Run as a script with RAY_AUTH_MODE=token and RAY_AUTH_TOKEN set; prints the
GCS address on one line, then keeps the cluster up until killed.
"""

import sys
import time

import ray

ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
print(ray.get_runtime_context().gcs_address, flush=True)
while True:
    time.sleep(1)
    if sys.stdin is None:
        break
