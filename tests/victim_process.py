"""A victim job run as its own driver process, as users run jobs (tests/victims/*.py print ``ready <job id>``)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raysleuth import cluster

HERE = Path(__file__).parent


class Victim:
    """A victim driver process and its Ray job."""

    def __init__(self, address: str, kind: str, *args: str, module: str = "victims.real_jobs") -> None:
        self.kind = kind
        self.stderr = tempfile.TemporaryFile(mode="w+")  # read back only when the victim fails to start
        self.proc = subprocess.Popen([sys.executable, "-m", module, kind, "--address", address, *args],
                                     cwd=str(HERE), env=dict(os.environ), stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)
        self.job_id: str | None = None

    def ready(self, timeout: float = 300) -> Victim:
        """Wait for the victim's ``ready <job id>`` line."""
        deadline = time.monotonic() + timeout
        line = ""
        while self.job_id is None and time.monotonic() < deadline:  # Ray may print warnings first
            readable, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = self.proc.stdout.readline() if readable else ""
            if line.startswith("ready"):
                self.job_id = line.split()[1]
            elif not line and self.proc.poll() is not None:
                break
        assert self.job_id, (f"victim {self.kind} did not start (last line {line!r}, exit {self.proc.poll()}); "
                             f"its stderr ends:\n{self._stderr_tail()}")
        return self

    def _stderr_tail(self, lines: int = 30) -> str:
        self.stderr.seek(0)
        return "".join(self.stderr.readlines()[-lines:])

    def actors(self, class_name: str | None = None) -> list[cluster.RayActor]:
        return [a for a in cluster.actors(state="ALIVE") if a.job_id == self.job_id
                and (class_name is None or (a.class_name or "").endswith(class_name))]

    def wait_for(self, class_name: str, count: int, timeout: float = 180) -> list[cluster.RayActor]:
        deadline = time.monotonic() + timeout
        found = []
        while time.monotonic() < deadline:
            found = [a for a in self.actors(class_name) if a.pid]
            if len(found) >= count:
                return found
            time.sleep(1)
        raise AssertionError(f"only {len(found)} of {count} {class_name} actors came up")

    def pids(self) -> list[int]:
        return [self.proc.pid] + [a.pid for a in self.actors() if a.pid]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.stderr.close()
