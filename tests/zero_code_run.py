"""Helpers for the zero-code tests: run an unmodified victim job under `raysleuth run`, read what it left.

Each job starts its own Ray (``--address local``) with its own temp root
(``RAY_TMPDIR``: its session logs, fatal-signal files included, stay apart
from other clusters on the machine) and its own ``RAYSLEUTH_HOME``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
VICTIMS = HERE / "victims"


@dataclass
class JobRun:
    """One finished job: its outputs and where its evidence went."""

    returncode: int
    stdout: str
    stderr: str
    home: Path
    ray_tmp: Path

    def store(self):
        from raysleuth.recorder import open_store

        return open_store(home=self.home)

    def has_evidence(self) -> bool:
        return any((self.home / "runs").glob("*/evidence.sqlite"))

    def fatal_files(self) -> list[Path]:
        return sorted({path.resolve() for path in self.ray_tmp.glob("ray/session_*/logs/raysleuth-fatal-*.log")})

    def crashes_cli(self) -> list[dict]:
        done = subprocess.run([sys.executable, "-m", "raysleuth", "crashes", "--json", "--home", str(self.home)],
                              env=_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode in (0, 1), done.stderr  # 1: crashes found
        return json.loads(done.stdout)


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("RAYSLEUTH_", "RAY_ADDRESS", "VERL_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env.update(extra)
    return env


def short_tmp() -> Path:
    """A short temp folder (Ray's unix sockets live under it and their paths are limited to 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="rs14-", dir="/tmp"))


def run_job(victim: str, *args: str, tmp: Path, mode: str | None = None, under_raysleuth: bool = True,
            timeout: float = 400, **env: str) -> JobRun:
    """Run ``tests/victims/<victim>`` (unmodified) under `raysleuth run`, or alone, and wait for it."""
    home, ray_tmp = tmp / "home", short_tmp()
    command = [sys.executable, str(VICTIMS / victim), *args]
    extra = {"RAY_TMPDIR": str(ray_tmp), **env}
    if under_raysleuth:
        mode_args = ["--mode", mode] if mode and mode != "off" else []
        if mode == "off":
            extra["RAYSLEUTH_MODE"] = "off"
        command = [sys.executable, "-m", "raysleuth", "run", *mode_args, "--address", "local", "--home", str(home),
                   "--", *command]
    else:
        extra["RAY_ADDRESS"] = "local"
    done = subprocess.run(command, env=_env(**extra), capture_output=True, text=True, timeout=timeout)
    return JobRun(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr, home=home, ray_tmp=ray_tmp)
