"""The doctor's report: every check group run in order, and the report stored as evidence."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

from raysleuth.doctor.checks import Check
from raysleuth.doctor.cluster_checks import _cluster_checks, _debug_cluster_checks
from raysleuth.doctor.local_checks import _debug_checks, _local_checks
from raysleuth.recorder import get_client

__all__ = ["DoctorReport", "run_doctor"]


@dataclasses.dataclass(kw_only=True)
class DoctorReport:
    """All checks, the cluster examined (if any), and how long it took."""

    checks: list[Check]
    cluster: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No check failed (warnings allowed)."""
        return not any(check.status == "fail" for check in self.checks)

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        counts = {"ok": 0, "warn": 0, "fail": 0, "skip": 0}
        for check in self.checks:
            counts[check.status] = counts.get(check.status, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``ok`` and ``counts`` included)."""
        return {"ok": self.ok, "counts": self.counts(), "seconds": self.seconds, "cluster": self.cluster,
                "checks": [dataclasses.asdict(check) for check in self.checks]}


def run_doctor(
    address: str | None = None,
    *,
    check_debug: bool = False,
    check_ports: bool = False,
    ray: bool = True,
    full: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    record: bool = True,
) -> DoctorReport:
    """Run the checks. ``full`` turns on every group; ``ray=False`` skips the cluster.

    With a reachable cluster, the report is also stored as evidence (kind
    ``doctor``) so ``raysleuth report`` shows it later.
    """
    started = time.monotonic()
    env = os.environ if env is None else env
    checks = _local_checks(env)
    if check_debug or full:
        checks += _debug_checks(env)
    cluster_info: dict[str, Any] = {}
    if ray or full:
        checks += _cluster_checks(address, ports=check_ports or full, per_node=True, timeout=timeout,
                                  info_out=cluster_info)
        if (check_debug or full) and cluster_info:
            checks += _debug_cluster_checks(timeout=timeout)
    report = DoctorReport(checks=checks, cluster=cluster_info or None, seconds=time.monotonic() - started)
    if record and cluster_info:
        try:
            client = get_client()
            client.record("doctor", report.to_dict(), name="doctor")
            client.flush(timeout=5)
        except Exception:
            pass
    return report
