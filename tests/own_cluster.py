"""Victims that start their own Ray cluster in a subprocess (to kill a node, or force the memory monitor)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def run_victim(module: str, tmp_path: Path, *, timeout: float) -> dict:
    """Run ``victims.<module>`` with its own raysleuth home, never joining another cluster; its last line is JSON."""
    env = {**os.environ, "RAYSLEUTH_HOME": str(tmp_path / "home"), "RAY_ADDRESS": ""}
    env.setdefault("RAY_raylet_start_wait_time_s", "180")  # a loaded machine registers raylets slowly
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", f"victims.{module}"], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
