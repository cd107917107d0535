"""The causes a death is classified as: one typed list, each with the words the user reads."""

from __future__ import annotations

from typing import Literal

__all__ = ["CAUSES", "Cause"]

#: Every cause a death is classified as (``DeathCause.cause``, a ``death`` record's ``cause``).
Cause = Literal["python_exception", "fatal_signal", "oom_killer", "sigkill", "memory_monitor", "ray_kill", "exit",
                "node_died", "init_failed", "owner_died", "out_of_scope", "unknown"]

CAUSES: dict[str, str] = {
    "python_exception": "a Python exception (a crash capsule recorded it)",
    "fatal_signal": "a fatal signal (segfault, abort...) with the Python stack it hit",
    "oom_killer": "SIGKILL from the kernel OOM killer",
    "sigkill": "SIGKILL from something else (kill -9, ray stop --force, a supervisor)",
    "memory_monitor": "killed by Ray's memory monitor (node running low on memory)",
    "ray_kill": "ray.kill on the actor",
    "exit": "the process exited on its own (sys.exit(n), os._exit(n), exit_actor)",
    "node_died": "its node died",
    "init_failed": "its __init__ raised",
    "owner_died": "the process that created it died",
    "out_of_scope": "every handle to it went out of scope",
    "unknown": "the evidence read does not decide it",
}
