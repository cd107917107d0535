"""Run a script as two real torch.distributed ranks (gloo on CPU, separate processes): ``script rank store out``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_two_ranks(script: str, tmp_path: Path, **env_extra: str) -> list:
    """Each rank's JSON result (what it wrote to its ``out`` file), else every rank's output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env_extra}
    env.pop("RAY_ADDRESS", None)
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(rank), str(store), str(tmp_path / f"{rank}.json")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    try:
        logs = [proc.communicate(timeout=180)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    if not all((tmp_path / f"{rank}.json").exists() for rank in range(2)):
        return logs
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
