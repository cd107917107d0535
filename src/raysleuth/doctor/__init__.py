"""``raysleuth doctor``: is this machine and cluster fit to debug on?

Each check returns a :class:`Check` (name, ok/warn/fail/skip, detail, fix,
node). Local checks need nothing; cluster checks connect (never start a
cluster) and fan out to the node agents, so per-node facts (versions,
py-spy, disk) are read on each node. A cluster that cannot be reached is a
failed check, not a crash.

:mod:`~raysleuth.doctor.checks` (what a check is, the thresholds),
:mod:`~raysleuth.doctor.local_checks`, :mod:`~raysleuth.doctor.cluster_checks`,
and :mod:`~raysleuth.doctor.report` (:func:`run_doctor`: the groups in order, the stored report).
"""

from __future__ import annotations

from raysleuth.doctor.checks import MIN_DEBUGPY, MIN_RAY, Check
from raysleuth.doctor.report import DoctorReport, run_doctor

__all__ = ["Check", "DoctorReport", "MIN_DEBUGPY", "MIN_RAY", "run_doctor"]
