"""A rank's node dies (removed from its own 2-node cluster, as when a machine is lost): cause node_died."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_node_death_is_classified_with_its_rank(tmp_path):
    env = {**os.environ, "RAYSLEUTH_HOME": str(tmp_path / "home"), "RAY_ADDRESS": ""}
    env.setdefault("RAY_raylet_start_wait_time_s", "180")  # a loaded machine registers raylets slowly
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "victims.node_death"], capture_output=True, text=True,
                          timeout=600, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    death = result["deaths"][0]
    assert (death["rank"], death["rank_source"], death["cause"]) == (1, "runtime_env", "node_died"), death
    assert death["ray_reason"] == "NODE_DIED" and death["evidence"]
