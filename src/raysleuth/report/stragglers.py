"""The report's "Stragglers" section: who was slow, from the run's collectives and ``straggler`` records.

- the verdict over the newest job's stored collectives (every dump in the
  run: :func:`raysleuth.stragglers.find_stragglers`), as ``raysleuth
  stragglers --run`` gives it;
- each straggler that ``raysleuth watch --slow`` reported while the job ran,
  with its slow phase (function, file:line) and where its peers waited.
"""

from __future__ import annotations

from typing import Any, Sequence

from raysleuth.recorder.store import Record


def straggler_section(straggler_records: Sequence[Record], collective_records: Sequence[Record] = ()
                      ) -> dict[str, Any] | None:
    """The section's data, or None when the run holds neither kind."""
    if not straggler_records and not collective_records:
        return None
    verdict = None
    if collective_records:
        from raysleuth.stragglers import stragglers_from_records

        report = stragglers_from_records([record.to_dict() for record in collective_records])
        if report.ranks or report.collectives:
            verdict = {"state": report.state, "summary": report.summary, "job_id": report.job_id,
                       "ranks": [{"rank": t.rank, "median_ms": round(t.median_lateness_s * 1000, 1),
                                  "late_share": t.late_share, "share_of_step": t.share_of_step}
                                 for t in report.ranks]}
    return {"verdict": verdict, "reported": [_reported(record) for record in straggler_records][-50:]}


def _reported(record: Record) -> dict[str, Any]:
    data = record.data if isinstance(record.data, dict) else {}
    rows = []
    for straggler in data.get("stragglers") if isinstance(data.get("stragglers"), list) else []:
        if not isinstance(straggler, dict):
            continue
        phase = straggler.get("phase") if isinstance(straggler.get("phase"), dict) else {}
        wait = phase.get("peers_wait") if isinstance(phase.get("peers_wait"), dict) else {}
        rows.append({"rank": straggler.get("rank"), "function": phase.get("function") or "",
                     "where": f"{str(phase.get('file') or '').rsplit('/', 1)[-1]}:{phase.get('line')}" if phase else "",
                     "peers_wait": f"{wait.get('function')} ({str(wait.get('file') or '').rsplit('/', 1)[-1]}:"
                                   f"{wait.get('line')})" if wait else ""})
    return {"time": record.time, "job_id": data.get("job_id"), "summary": str(data.get("summary") or ""),
            "stragglers": rows}
