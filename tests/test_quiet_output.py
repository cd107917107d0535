"""Quiet, readable output: no native noise from raysleuth's own probe, no 80-column wrapping in pipes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from raysleuth.postmortem import build_capsule
from raysleuth.recorder.store import open_run

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
MESSAGE = "NCCL watchdog: collective operation ALLREDUCE timed out after 600000 milliseconds on rank 3"


def test_tables_in_a_pipe_keep_one_record_per_line(tmp_path):
    store = open_run(tmp_path, "wide")
    try:
        raise RuntimeError(MESSAGE)
    except RuntimeError as error:
        store.add("crash", build_capsule(error, method="Trainer.step").to_dict(), rank=3, name="Trainer.step",
                  level="ERROR")
    store.close()
    env = {key: value for key, value in ENV.items() if key != "COLUMNS"}
    env["RAYSLEUTH_HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "raysleuth", "crashes"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    rows = [line for line in done.stdout.splitlines() if "Trainer.step" in line]
    assert len(rows) == 1 and "RuntimeError: NCCL watchdog: collective operation ALLREDUCE" in rows[0], done.stdout
    header = next(line for line in done.stdout.splitlines() if line.startswith("id"))
    assert "likely cause" in header, done.stdout  # every column on the header line, none wrapped below


_NOISY = r"""
import os, re, sys
from raysleuth.native_stderr import filtered_stderr
with filtered_stderr(re.compile(r"gcs_client\.cc.*InvalidAuthToken")):
    os.write(2, b"[W] gcs_client.cc:210: Failed to get cluster ID: Unauthenticated: InvalidAuthToken\n")
    os.write(2, b"[E] core_worker.cc:99: a real error the user must see\n")
    print("python stderr still works", file=sys.stderr)
print("done")
"""


def test_native_noise_is_dropped_and_real_errors_kept():
    done = subprocess.run([sys.executable, "-c", _NOISY], capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert "InvalidAuthToken" not in done.stderr
    assert "a real error the user must see" in done.stderr and "python stderr still works" in done.stderr


def test_probe_noise_pattern_matches_rays_line():
    from raysleuth.cluster import _PROBE_NOISE

    line = ("[2026-11-30 12:23:29,309 W 12043 12043] gcs_client.cc:210: Failed to get cluster ID from GCS server: "
            "Unauthenticated: RPC error: InvalidAuthToken: Authentication token is missing or incorrect")
    assert _PROBE_NOISE.search(line)
    assert not _PROBE_NOISE.search("[E] gcs_client.cc:300: GCS connection lost, retrying")


def test_unreachable_gcs_noise_pattern_matches_rays_lines():
    """Ray's C++ client warns while raysleuth's probe meets a port that is no GCS; raysleuth's own line says it."""
    from raysleuth.cluster.connection import _UNREACHABLE_NOISE

    for line in ("[2026-12-01 09:47:19,298 W 2454 2454] rpc_client.h:153: Failed to connect to GCS at address "
                 "127.0.0.1:60151 within 5 seconds.",
                 "[2026-12-01 09:47:54,328 W 2454 2454] gcs_client.cc:210: Failed to get cluster ID from GCS server: "
                 "TimedOut: Timed out while waiting for GCS to become available."):
        assert _UNREACHABLE_NOISE.search(line)
    assert not _UNREACHABLE_NOISE.search("[E] core_worker.cc:99: a real error the user must see")
