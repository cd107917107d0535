"""The report's "Stragglers" section: who was slow, from the run's collectives and ``straggler`` records.

- the verdict over the newest job's stored collectives (every dump in the
  run: :func:`raysleuth.stragglers.find_stragglers`), as ``raysleuth
  stragglers --run`` gives it;
- each straggler that ``raysleuth watch --slow`` reported while the job ran,
  with its slow phase (function, file:line) and where its peers waited.
"""

from __future__ import annotations

from typing import Any, Sequence

from raysleuth.evidence import SlowPhasePart, StragglerRun, WaitSite
from raysleuth.stragglers import stragglers_from_records


def straggler_section(reported: Sequence[StragglerRun], collective_records: Sequence[Any] = ()
                      ) -> dict[str, Any] | None:
    """The section's data, or None when the run holds neither kind (``collective_records``: stored records)."""
    if not reported and not collective_records:
        return None
    verdict = None
    if collective_records:
        report = stragglers_from_records([record.to_dict() for record in collective_records])
        if report.ranks or report.collectives:
            verdict = {"state": report.state, "summary": report.summary, "job_id": report.job_id,
                       "ranks": [{"rank": t.rank, "median_ms": round(t.median_lateness_s * 1000, 1),
                                  "late_share": t.late_share, "share_of_step": t.share_of_step}
                                 for t in report.ranks]}
    return {"verdict": verdict, "reported": [_reported(record) for record in reported][-50:]}


def _where(site: SlowPhasePart | WaitSite) -> str:
    return f"{(site.file or '').rsplit('/', 1)[-1]}:{site.line}"


def _reported(record: StragglerRun) -> dict[str, Any]:
    rows = []
    for straggler in record.stragglers:
        phase, wait = straggler.phase, straggler.phase.peers_wait if straggler.phase else None
        rows.append({"rank": straggler.rank, "function": (phase.function if phase else None) or "",
                     "where": _where(phase) if phase else "",
                     "peers_wait": f"{wait.function} ({_where(wait)})" if wait else ""})
    return {"time": record.row.time, "job_id": record.job_id, "summary": record.summary, "stragglers": rows}
