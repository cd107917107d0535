"""``raysleuth report``: one self-contained HTML page of a run's evidence.

:func:`generate_report` reads a run through :func:`raysleuth.recorder.open_store`
(read-only; the cluster may be gone), builds each section with the pure
builders of :mod:`raysleuth.report.sections`, draws the charts with plotly
(:mod:`.charts`)
and renders ``templates/report.html.j2`` with jinja2. plotly's JavaScript is
embedded inline, so the file opens offline with no network at all.

Sections: run summary, doctor, stacks and verdicts, tasks, consistency
checks, per-rank memory curves and leak verdicts, crashes, warning/error logs
by rank, per-step phase durations per rank (stragglers), weight syncs with the
logprob gap beside them (:mod:`raysleuth.report.weights`), the ranks that entered
collectives late (:mod:`raysleuth.report.stragglers`), and a link to the
Perfetto trace when one was exported next to the report.

Scale: the dense kinds are read as aggregates (:mod:`.overview`, in numpy
from columns where it can, else in SQL): memory curves one point per worker
and time bucket, step phases one total per step, rank and phase, leak
verdicts from the fast
:func:`~raysleuth.memory.memory_report`; past 16 ranks the charts draw the
ranks as one band plus the ranks that stand out. Every other section reads
at most :data:`MAX_RECORDS` records (the newest), and the page says where it
cut: how many records the section shows, the run holds and it left out.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from raysleuth import evidence
from raysleuth.errors import UsageError
from raysleuth.collectives.report import read_collectives, stored_verdict
from raysleuth.memory import memory_report
from raysleuth.memory.trend import quiet_kind
from raysleuth.options import format_ranks
from raysleuth.recorder import blocks, open_store
from raysleuth.recorder.counting import count_span, time_range, writers
from raysleuth.recorder.reading import bulk
from raysleuth.report import charts, overview, sections
from raysleuth.report.weights import weights_section
from raysleuth.report.stragglers import straggler_section

__all__ = ["MAX_RECORDS", "ReportResult", "build_report_data", "generate_report", "render_report"]

MAX_RECORDS = 50_000

#: The evidence kinds each section reads.
SECTION_KINDS: dict[str, tuple[type[evidence.Evidence], ...]] = {
    "doctor": (evidence.DoctorRun,),
    "stacks": (evidence.StackRun,),
    "tasks": (evidence.TasksRun,),
    "consistency": (evidence.Consistency,),
    "crashes": (evidence.Crash, evidence.Death),
    "logs": (evidence.Log,),
    "stragglers": (evidence.StragglerRun,),
}
#: Kinds read as records by the feature that owns them (``raysleuth weights``'s reader).
RECORD_KINDS = {"weights": ("weight_sync", "logprob_gap")}
#: What a section reads of its kinds, beyond their kind: the logs section shows warnings and errors only, so its
#: newest :data:`MAX_RECORDS` are those (50,000 INFO lines newer than an error no longer push it off the page).
SECTION_FILTERS: dict[str, dict[str, Any]] = {"logs": {"severe_logs": True}}


@dataclasses.dataclass(kw_only=True)
class ReportResult:
    """What :func:`generate_report` wrote."""

    path: Path
    """The HTML file."""
    run_id: str
    store_path: Path
    sections: dict[str, int]
    """Per section, how many items it shows (0: the section says it has no evidence)."""
    trace_path: Path | None = None
    bytes: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {key: str(value) if isinstance(value, Path) else value for key, value in dataclasses.asdict(self).items()}


def _newest(store, kinds: tuple, **filters: Any) -> list:
    """At most :data:`MAX_RECORDS` of ``kinds`` (evidence classes, or kind names read as records), oldest first."""
    if kinds and isinstance(kinds[0], str):
        records = store.query(list(kinds), limit=MAX_RECORDS, newest_first=True, **filters)
    else:
        records = evidence.read(store, kinds, limit=MAX_RECORDS, newest_first=True, **filters)
    records.reverse()
    return records


def _held(store, kinds: tuple, **filters: Any) -> int:
    """How many records the query of :func:`_newest` matches in all (its ``limit`` aside)."""
    if kinds and isinstance(kinds[0], str):
        return count_span(store, list(kinds), **filters)[0]
    names = {kind.NAME for kind in kinds}
    name = next(iter(names)) if len(names) == 1 and None not in names else None
    return count_span(store, sorted({kind.KIND for kind in kinds}), name=name, **filters)[0]


def _capped(store, fetched: dict[str, list]) -> dict[str, dict[str, int]]:
    """Per section cut to :data:`MAX_RECORDS`: the records it shows, the run holds and it left out."""
    capped = {}
    for section, names in {**SECTION_KINDS, **RECORD_KINDS}.items():
        held = _held(store, names, **SECTION_FILTERS.get(section, {}))  # counted apart: a cut query may show fewer
        if held > MAX_RECORDS:
            capped[section] = {"kept": len(fetched[section]), "held": held, "left_out": held - MAX_RECORDS}
    return capped


def build_report_data(store) -> dict[str, Any]:
    """Every section's data from an open :class:`~raysleuth.recorder.EvidenceStore` (no charts yet)."""
    kinds = store.kinds()
    meta = store.meta()
    fetched = {section: _newest(store, names, **SECTION_FILTERS.get(section, {}))
               for section, names in {**SECTION_KINDS, **RECORD_KINDS}.items()}
    first, last = time_range(store, kinds)  # the summary: every writer, and the run's first and last record
    sample = [SimpleNamespace(rank=rank, node_ip=ip, hostname=host, actor_class=actor, time=when)
              for rank, ip, host, actor in writers(store, kinds) for when in (first, last)]
    return {
        "capped": _capped(store, fetched),
        "summary": sections.summary_section(kinds, meta, sample),
        "doctor": _robust(sections.doctor_section, fetched["doctor"]),
        "stacks": _robust(sections.stack_section, fetched["stacks"]),
        "tasks": _robust(sections.task_section, fetched["tasks"]),
        "collectives": _collectives(store),
        "consistency": _robust(sections.consistency_section, fetched["consistency"]),
        "memory": _memory(store),
        "crashes": _robust(sections.crash_section, fetched["crashes"]),
        **_logs(fetched["logs"]),
        "spans": overview.span_overview(store),
        "weights": _robust(weights_section, fetched["weights"]),
        "stragglers": straggler_section(fetched["stragglers"]),  # the verdict: `raysleuth stragglers`
    }


def _robust(build, records: list) -> dict[str, Any]:
    """``build(records)``; when a malformed row (not what its kind's writer stores) breaks it, without that row."""
    try:
        return build(records)
    except Exception:
        pass
    kept = []
    for record in records:
        try:
            build([record])
        except Exception:
            continue
        kept.append(record)
    return build(kept)


def _logs(records: list) -> dict[str, Any]:
    """``logs``: warning and error lines per rank; past :data:`~raysleuth.report.overview.ALONE` ranks, ``log_groups``
    instead (one row per message, its ranks as ranges: a thousand ranks make as short a section as sixteen)."""
    per_rank = _robust(sections.log_section, records)
    if len(per_rank) <= overview.ALONE:
        return {"logs": per_rank}
    return {"logs": {}, "log_groups": _robust(sections.log_groups, records)}


def _collectives(store) -> dict[str, Any] | None:
    """The collectives verdict as ``raysleuth collectives --run`` reads it (a dump at a time); when a malformed
    dump breaks that read, every dump read whole and the section built without the rows that break it."""
    try:
        return sections.verdict_section(stored_verdict(store))
    except Exception:
        return _robust(sections.collective_section, read_collectives(store))


def _memory(store) -> dict[str, Any]:
    """Leak verdicts from :func:`raysleuth.memory.memory_report` (leaks first); curves from SQL aggregates.

    Past :data:`~raysleuth.report.overview.ALONE` workers the ones without a leak are told as groups (what their
    verdict says, their ranks as ranges, how much they grew) and the few that grew most, each with its slope:
    only those are fitted a line (``fit_quiet``), as a thousand rows of "no lasting growth" would tell no more.
    """
    with blocks.snapshot(store):  # the verdicts and the curves of one state of the file: one read of each block
        frame = overview.curve_frame(store)
        runs = blocks.RssRuns(store, frame[1], start=frame[0]) if frame else None
        try:  # the page shows no MiB/step
            report = memory_report(store, per_step=False, fit_quiet=overview.ALONE, on_block=runs.add if runs else None)
            if runs is not None:
                runs.whole = True  # every job's samples went through it
        except Exception:
            report = None
        workers = report.workers if report else []
        leaking = sorted({w.rank for w in workers if w.leak and w.rank is not None})
        drawn = overview.memory_curves(store, set(leaking), runs=runs if report else None)
    verdicts = [{"time": worker.last_time, "rank": worker.rank, "pid": worker.pid, "leak": worker.leak,
                 "slope": None if worker.slope_bytes_per_s is None else f"{worker.slope_bytes_per_s / 2**20:.2f} MiB/s",
                 "reason": f"pid {worker.pid}, {worker.samples} samples: {worker.reason}",
                 "kind": _quiet_kind(worker.status, worker.evidence), "growth": worker.evidence.get("growth_bytes")}
                for worker in workers]
    verdicts.sort(key=lambda v: not v["leak"])
    quiet = [v for v in verdicts if not v["leak"]]
    many = len(verdicts) > overview.ALONE
    grew_most = sorted((v for v in quiet if v["slope"] is not None), key=lambda v: -float(v["growth"] or 0.0))
    return {"curves": drawn["curves"], "verdicts": verdicts, "leaking_ranks": leaking, "band": drawn["band"],
            "grouped": drawn["grouped"], "quiet_groups": _quiet_groups(quiet) if many else [],
            "grew_most": grew_most if many else [],
            "quiet": (f"{len(quiet)} workers without a leak (ranks "
                      f"{format_ranks(int(v['rank']) for v in quiet if v['rank'] is not None)})") if quiet else ""}


def _quiet_kind(status: str, evidence: dict[str, Any]) -> str:
    """What a verdict without a leak says: its status, or the words its reason begins with (``trend.quiet_kind``)."""
    if status != "ok":
        return status
    return quiet_kind(evidence.get("growth_bytes") or 0.0, evidence.get("floor_growth_bytes") or 0.0)


def _quiet_groups(quiet: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workers without a leak by what their verdict says: how many, their ranks, how much they grew."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for verdict in quiet:
        groups.setdefault(verdict["kind"], []).append(verdict)
    rows = []
    for kind, members in sorted(groups.items(), key=lambda item: -len(item[1])):
        ranks = [int(v["rank"]) for v in members if v["rank"] is not None]
        grown = [v["growth"] / 2**20 for v in members if v["growth"] is not None]
        unranked = len(members) - len(ranks)
        label = format_ranks(ranks) if ranks else ""
        if unranked:
            label = f"{label} and {unranked} without a rank" if label else f"{unranked} without a rank"
        rows.append({"kind": kind, "count": len(members), "ranks": label,
                     "growth": f"{min(grown):+.0f} to {max(grown):+.0f} MiB" if grown else ""})
    return rows


# ------------------------------------------------------------------ render


def _format_time(value: float | None) -> str:
    if value is None:
        return ""
    return _dt.datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")


def render_report(data: dict[str, Any], *, title: str, trace_href: str | None = None,
                  store_path: str = "", inline_js: bool = True) -> str:
    """The HTML text of a report from :func:`build_report_data`'s output."""
    import jinja2

    loader = jinja2.PackageLoader("raysleuth", "templates")
    env = jinja2.Environment(loader=loader, autoescape=jinja2.select_autoescape(["html", "j2"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["when"] = _format_time
    env.filters["rank"] = sections.rank_label
    env.filters["ranges"] = format_ranks
    plotly_js = ""
    if inline_js:
        from plotly.offline import get_plotlyjs

        # A literal "</script>" inside the bundle would end the tag early.
        plotly_js = get_plotlyjs().replace("</script>", "<\\/script>")
    template = env.get_template("report.html.j2")
    return template.render(title=title, data=data, charts=charts.charts(data), plotly_js=plotly_js,
                           max_records=MAX_RECORDS, trace_href=trace_href, store_path=store_path,
                           generated=_format_time(time.time()), escape=html.escape)


def checked_output(output: Path | str) -> Path:
    """Where the report goes: an existing folder gets ``report.html`` inside it; a missing folder is an error.

    Never creates folders: a typo in ``-o /nonexistent/dir/r.html`` is reported, not made.
    """
    path = Path(output).expanduser()
    if path.is_dir():
        return path / "report.html"
    if not path.parent.is_dir():
        raise UsageError(f"-o {output}: the folder {path.parent} does not exist",
                         fix="create it first, or write the report elsewhere (e.g. -o report.html)")
    return path


def generate_report(output: Path | str = "report.html", *, run: str | None = None, home: Path | str | None = None,
                    trace_path: Path | str | None = None) -> ReportResult:
    """Write the HTML report of ``run`` (default: the latest) to ``output``.

    ``trace_path``: a Perfetto trace (``raysleuth timeline -o``) to link; when
    omitted, ``trace.json`` next to ``output`` is linked if it exists.
    Raises :class:`~raysleuth.errors.StoreNotFound` when there is no such run.
    """
    started = time.monotonic()
    output = checked_output(output)
    if trace_path is not None and not Path(trace_path).expanduser().is_file():
        raise UsageError(f"--trace {trace_path}: no such file", fix="write one first (`raysleuth timeline -o "
                         "trace.json`), or leave --trace out (trace.json next to the report is linked when present)")
    store = open_store(run, home=home)
    try:
        with bulk():  # a thousand workers' columns and dumps' entries: nothing for the collector to walk
            data = build_report_data(store)
        run_id = data["summary"]["run_id"] or store.path.parent.name
        store_path = store.path
    finally:
        store.close()
    trace: Path | None = Path(trace_path).expanduser() if trace_path else output.parent / "trace.json"
    trace_href = None
    if trace is not None and trace.is_file():
        try:
            trace_href = os.path.relpath(trace.resolve(), output.parent.resolve())
        except ValueError:  # another drive (Windows)
            trace_href = trace.resolve().as_uri()
    else:
        trace = None
    text = render_report(data, title=f"raysleuth report — {run_id}", trace_href=trace_href,
                         store_path=str(store_path))
    tmp = output.with_suffix(output.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, output)
    counts = {
        "doctor": len(data["doctor"]["checks"]) if data["doctor"] else 0,
        "stacks": len(data["stacks"]),
        "tasks": len(data["tasks"]),
        "collectives": len(data["collectives"]["groups"]) if data["collectives"] else 0,
        "consistency": len(data["consistency"]),
        "memory": sum(len(c["x"]) for c in data["memory"]["curves"].values()) + len(data["memory"]["verdicts"]),
        "crashes": len(data["crashes"]),
        "logs": data["log_groups"]["lines"] if data.get("log_groups") else sum(map(len, data["logs"].values())),
        "spans": len(data["spans"]["steps"]),
        "weights": len(data["weights"]["syncs"]),
        "stragglers": len(data["stragglers"]["reported"]) + bool(data["stragglers"]["verdict"]) if data["stragglers"] else 0,
    }
    return ReportResult(path=output, run_id=run_id, store_path=store_path, sections=counts, trace_path=trace,
                        bytes=len(text.encode()), seconds=round(time.monotonic() - started, 3))
