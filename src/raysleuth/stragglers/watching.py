"""``raysleuth watch --slow``: repeat the straggler check; report and record a straggler once it appears.

Each new straggler (a rank not reported before, or reported before without
a slow phase and now with one: the samples could not tell it then) is
written to the store as one ``straggler`` record (level ``WARNING``; data: the
:class:`~raysleuth.stragglers.analysis.StragglerReport`, its slow phase
included), so the run keeps it after the job is gone and ``raysleuth
report`` shows it.
"""

from __future__ import annotations

import time
from pathlib import Path

from raysleuth.recorder import get_client, record
from raysleuth.stragglers.analysis import StragglerReport
from raysleuth.stragglers.collect import Options, collect_stragglers

EVERY = 10.0
"""Seconds between two checks."""


class SlowWatch:
    """The repeated check; :meth:`tick` returns a report when a new straggler appeared, else None."""

    def __init__(self, address: str | None = None, *, home: Path | str | None = None, job: str | None = None,
                 every: float = EVERY, options: Options | None = None) -> None:
        self.address, self.home, self.job, self.every = address, home, job, every
        self.options = options or Options(window=max(every * 2, 20.0))
        self.reported: set[int] = set()
        """Ranks reported with their slow phase, or with none while sampling was off."""
        self.unphased: set[int] = set()
        """Ranks reported without a slow phase (not clear yet): reported again once it is."""
        self.last: StragglerReport | None = None
        self.error: str | None = None
        self._next = 0.0

    def tick(self) -> StragglerReport | None:
        """Check when one is due; never raises (an error is kept in :attr:`error`)."""
        if time.monotonic() < self._next:
            return None
        self._next = time.monotonic() + self.every
        try:
            report = collect_stragglers(self.address, home=self.home, job=self.job, options=self.options)
        except Exception as error:  # the watch goes on: the next check may see the job
            self.error = f"{type(error).__name__}: {error}"
            return None
        self.last, self.error = report, None
        new = [s for s in report.stragglers if s.rank not in self.reported
               and (s.rank not in self.unphased or s.phase is not None)]
        if not new:
            return None
        for straggler in new:
            self.unphased.discard(straggler.rank)
            phased = straggler.phase is not None or self.options.sample <= 0
            (self.reported if phased else self.unphased).add(straggler.rank)
        record_straggler(report)
        return report


def record_straggler(report: StragglerReport) -> None:
    """Write the report as one ``straggler`` record and flush it (never raises)."""
    try:
        ranks = ",".join(str(s.rank) for s in report.stragglers)
        record("straggler", report.to_dict(), name=f"rank {ranks}", level="WARNING")
        get_client().flush(timeout=5.0)
    except Exception:
        pass
