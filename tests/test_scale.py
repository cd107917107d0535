"""The fast read paths answer exactly what the record-by-record readers answered, on the same store.

A synthetic run (``bench/_synthetic.py``, the one ``bench/bench_scale.py``
times at 1,000 ranks x 60 minutes) of 100 ranks x 5 minutes, light and full,
plus the awkward rows a real run has: a worker whose rank became known late,
samples taken from outside by the agents, a row that is not JSON. The old
readers live on in ``tests/scale_reference.py``. Pure store: no Ray.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from scale_reference import (
    old_build_timeline,
    old_call_at,
    old_judge,
    old_mann_kendall_s,
    old_memory_report,
    old_theil_sen,
    old_timeline_summary_rows,
)
from scale_reference import normal_events as _events

from raysleuth.cli import main
from raysleuth.cli.memory import GROWERS, TABLE_ROWS
from raysleuth.cli.timeline import SUMMARY_ROWS
from raysleuth.collectives import match
from raysleuth.collectives.model import _call_at, positions_from_records
from raysleuth.collectives.report import read_collectives
from raysleuth.memory import memory_report
from raysleuth.memory.pairs import _median_in_place, _median_list
from raysleuth.memory.trend import LeakPolicy, _judge, _mann_kendall_s, kendall_tau, theil_sen
from raysleuth.options import format_ranks, parse_ranks
from raysleuth.recorder import blocks
from raysleuth.recorder.store import EvidenceStore
from raysleuth.timeline import export_timeline, summarize_steps, timeline_summary

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from _synthetic import START, build_store, identity  # noqa: E402


def _awkward_rows(store: EvidenceStore) -> None:
    """A late rank, agent samples of another worker, a broken row."""
    header = identity(150, 100) | {"pid": 31_000, "client_id": "late-rank"}
    rows = []
    for n in range(40):
        data = {"rss_bytes": 2**30 + n * 2**24, "uss_bytes": 2**30 + n * 2**24, "source": "watch"}
        rows.append(("memory", START + 5 + n * 5, None if n < 15 else 150, n, None, None, None, data, n))
    store.write_batch(header, rows)
    agent = {"node_id": identity(3, 100)["node_id"], "node_ip": "10.0.0.9", "pid": 31_500, "client_id": None}
    store.write_batch(agent, [("memory", START + 7 + n * 5, 151, None, None, None, None,
                               {"rss_bytes": 5 * 2**30, "uss_bytes": 4 * 2**30, "vms_bytes": 9 * 2**30,
                                "source": "agent", "pid": 31_500, "node_ip": "10.0.0.9"}, None)
                              for n in range(30)])
    store._db.execute("INSERT INTO records (kind, time, rank, data) VALUES ('memory', ?, 3, '{bad json')", (START + 9,))
    store._db.execute("INSERT INTO records (kind, time, rank, data) VALUES ('span', ?, 3, '[1, 2]')", (START + 9,))
    store._db.execute("INSERT INTO records (kind, time, rank, data) VALUES ('collectives', ?, 3, '{bad json')",
                      (START + 9,))
    store._db.commit()


def _build(home: Path, mode: str, ranks: int) -> Path:
    path = home / "runs" / "synthetic" / "evidence.sqlite"
    path.parent.mkdir(parents=True)
    build_store(path, ranks=ranks, minutes=5, mode=mode)
    store = EvidenceStore(path)
    _awkward_rows(store)
    store.close()
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """100 ranks x 5 minutes, light."""
    return _build(tmp_path_factory.mktemp("scale-light"), "light", 100)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    """20 ranks x 5 minutes, full: a memory sample a second (300 a worker)."""
    return _build(tmp_path_factory.mktemp("scale-full"), "full", 20)


def _open(path: Path) -> EvidenceStore:
    return EvidenceStore(path, readonly=True)


@pytest.mark.parametrize(("which", "ranks"), [("light", None), ("light", [7, 13]), ("light", [150, 151]),
                                             ("full", None)])
def test_memory_report_answers_as_before(request, which, ranks):
    store = _open(request.getfixturevalue("run" if which == "light" else "full_run"))
    assert blocks.top(store)  # the samples are read from the blocks the store's write path sealed
    new, old = memory_report(store, rank=ranks), old_memory_report(store, rank=ranks)
    assert new.to_dict() == old.to_dict()
    assert new.workers and (ranks is not None or any(worker.leak for worker in new.workers))
    table = memory_report(store, rank=ranks, per_step=False).to_dict()  # what `raysleuth memory` draws its table of
    everything = new.to_dict()
    assert any(w["slope_bytes_per_step"] is not None for w in everything["workers"])
    assert all(w["slope_bytes_per_step"] is None for w in table["workers"])
    for worker in everything["workers"]:
        worker["slope_bytes_per_step"] = worker["evidence"]["slope_bytes_per_step"] = None
    assert table == everything
    late = [worker for worker in new.workers if worker.pid == 31_000]
    if ranks is None:  # its first 15 samples had no rank yet: one worker all the same
        assert late and late[0].rank == 150 and late[0].samples == 40


@pytest.mark.parametrize("fit_quiet", [0, 5, 16])
def test_fit_quiet_lines_only_the_quiet_workers_that_grew_most(run, fit_quiet):
    """The report's call (``fit_quiet``): every verdict as in full; the evidence lines of the leaks and of the
    ``fit_quiet`` workers without a leak that grew most, as in full; the other workers' lines None."""
    import copy

    store = _open(run)
    full = memory_report(store, per_step=False).to_dict()["workers"]
    bare = memory_report(store, per_step=False, fit_quiet=fit_quiet).to_dict()["workers"]
    assert len(bare) == len(full) > 16
    quiet = [at for at, worker in enumerate(full) if worker["status"] == "ok" and not worker["leak"]]
    quiet.sort(key=lambda at: -full[at]["evidence"]["growth_bytes"])  # stable: the first read first on a tie
    fitted = set(quiet[:fit_quiet]) | {at for at, worker in enumerate(full) if worker["leak"]}
    assert any(worker["leak"] for worker in full) and len(fitted) >= fit_quiet
    lines = ("slope_bytes_per_s", "slope_bytes_per_step", "r2", "tau")
    for at, (mine, theirs) in enumerate(zip(copy.deepcopy(bare), copy.deepcopy(full))):
        if at in fitted:
            assert mine == theirs
        else:
            assert all(mine["evidence"][k] is None for k in lines)
            assert all(mine[k] is None for k in lines if k in mine)
            for k in lines:
                mine.pop(k, None), theirs.pop(k, None), mine["evidence"].pop(k), theirs["evidence"].pop(k)
            assert mine == theirs
    assert memory_report(store, per_step=False, fit_quiet=len(full)).to_dict()["workers"] == full  # few: all


def test_the_report_tells_the_quiet_workers_as_groups_and_the_ones_that_grew_most(run):
    import html

    from raysleuth.report import build_report_data, render_report

    store = _open(run)
    data = build_report_data(store)
    memory = data["memory"]
    full = memory_report(store, per_step=False).workers
    quiet = [worker for worker in full if not worker.leak]
    assert sum(group["count"] for group in memory["quiet_groups"]) == len(quiet) > 16
    kinds = {group["kind"] for group in memory["quiet_groups"]}
    assert kinds <= {"flat or shrinking", "no lasting growth", "not enough data"} and kinds
    for group in memory["quiet_groups"]:  # its reason's own words, for every member
        members = [w for w in quiet if w.reason.startswith(group["kind"])]
        assert len(members) == group["count"], group
    grew = sorted((w for w in quiet if w.status == "ok"), key=lambda w: -w.evidence["growth_bytes"])[:16]
    assert [(v["rank"], v["slope"]) for v in memory["grew_most"]] == \
        [(w.rank, f"{w.slope_bytes_per_s / 2**20:.2f} MiB/s") for w in grew]
    page = render_report(data, title="scale", inline_js=False)
    assert "The 16 that grew most:" in page and page.count("LEAK</td>") == len(full) - len(quiet)
    for group in memory["quiet_groups"]:
        assert f"<td>{group['count']}</td><td>{group['kind']}</td><td>{html.escape(group['ranks'])}</td>" in page


def test_the_leak_test_counts_every_pair_in_n_log_n():
    rng = np.random.default_rng(27)
    for n in (3, 65, 400, 401, 600, 601, 1024, 1025, 2878, 3001, 4097):
        for values in (rng.integers(0, 5, n), rng.normal(size=n), np.arange(n)[::-1], np.arange(n), np.full(n, 7.0),
                       np.cumsum(rng.normal(0.2, 1.0, n)).round(0)):
            assert _mann_kendall_s(np.asarray(values, dtype=float)) == old_mann_kendall_s(values), n
    tau, z = kendall_tau(np.arange(5000.0))
    assert tau == 1.0 and z > 50


def test_the_median_of_the_pairs_is_numpys_median():
    """Selected among the values around the middle: the same value as np.median, ties, NaN and infinities too."""
    rng = np.random.default_rng(41)
    for n in (1, 2, 3, 4095, 4096, 4097, 41_328, 41_329):
        for values in (rng.normal(size=n), rng.integers(0, 3, n) * 1.0, np.full(n, 2.5), np.sort(rng.normal(size=n)),
                       np.repeat([0.0, 1.0], [n // 2, n - n // 2]), rng.standard_cauchy(n),
                       np.where(rng.random(n) < 0.3, np.inf, rng.normal(size=n)),
                       rng.integers(-8, 8, n) * 2.0**20 / (10 * rng.integers(1, 288, n))):
            expected, got = float(np.median(values)), _median_in_place(values.copy())
            assert got == expected or (np.isnan(got) and np.isnan(expected)), n
            for share in (0.01, 0.3, 0.7):  # pairs left out (set to -inf): the median of the others
                left_out = rng.random(n) < share
                if left_out.all():
                    continue
                marked = np.where(left_out, -np.inf, values)
                expected = float(np.median(values[~left_out]))
                got = _median_in_place(marked, skip=int(left_out.sum()))
                assert got == expected or (np.isnan(got) and np.isnan(expected)), (n, share)
    for n in range(1, 70):  # a fifth of a window, as the leak test's levels read it
        for values in (rng.normal(size=n), rng.integers(0, 3, n) * 1.0, np.where(rng.random(n) < 0.3, np.inf, -np.inf)):
            with np.errstate(invalid="ignore"):  # inf and -inf in the middle: NaN, both ways
                expected = float(np.median(values))
            got = _median_list(values.tolist())
            assert got == expected or (np.isnan(got) and np.isnan(expected)), n
    with_nan = rng.normal(size=50_000)
    with_nan[7] = np.nan
    assert np.isnan(_median_in_place(with_nan))


def test_theil_sen_answers_as_every_pair_in_fresh_arrays():
    """Times, steps that repeat (pairs of equal x left out), one x only, noisy plateaus and slopes, thinned."""
    rng = np.random.default_rng(8)
    for trial in range(120):
        n = int(rng.integers(2, 700))
        x = np.sort(rng.integers(0, max(2, n // (1 + trial % 3)), n)).astype(float)
        if trial % 5 == 0:
            x = np.arange(n) * 10.0
        if trial % 7 == 0:
            x = np.zeros(n)
        y = 6e9 + rng.integers(-8, 8, n) * 2.0**20 + rng.integers(0, 3) * x * 2.0**14
        assert theil_sen(x.tolist(), y.tolist()) == old_theil_sen(x.tolist(), y.tolist()), trial


def test_the_leak_test_counts_its_trend_tests_only_where_they_decide():
    """Each pattern needs growth of some size: the Kendall tests skipped where it is missing change no pattern."""
    rng = np.random.default_rng(5)
    policy = LeakPolicy()
    shapes = []
    for n in (12, 40, 288):
        t = np.arange(n, dtype=float)
        base = 6e9 + rng.integers(-8, 8, n) * 2.0**20
        shapes += [base, base + t * 2**20, base + t * 4 * 2**20, base + np.minimum(t, n / 2) * 2**26,
                   base + np.where(t > 2 * n / 3, (t - 2 * n / 3) * 2**26, 0), base[::-1] + t * 2**18,
                   np.full(n, 2.0**30), 2.0**30 + (t % 7) * 2**24]
    for ys in shapes:
        ys = ys.tolist()
        old = old_judge(ys, policy)
        assert _judge(ys, policy) == old
        assert _judge(ys, policy, evidence=False)["pattern"] == old["pattern"]
    assert {old_judge(ys.tolist(), policy)["pattern"] for ys in shapes} >= {None, "steady", "climb", "recent"}


def test_timeline_summary_answers_as_before(run):
    store = _open(run)
    old = summarize_steps(old_timeline_summary_rows(store))
    new = timeline_summary(run=str(run))
    assert [vars(row) for row in new] == [vars(row) for row in old]
    assert any(row.slowest == "5" for row in new)  # the synthetic straggler


def test_timeline_export_streams_the_same_events(run, tmp_path):
    exported = export_timeline(tmp_path / "trace.json", run=str(run), ray_tasks=False)
    written = json.loads((tmp_path / "trace.json").read_text())
    old = old_build_timeline(run=str(run), ray_tasks=False)
    assert _events(written["traceEvents"]) == _events(old.events)
    assert exported.written == len(old.events) and exported.spans == old.spans
    assert exported.memory_samples == old.memory_samples and exported.instant_events == old.instant_events
    bounded = export_timeline(tmp_path / "steps.json", run=str(run), ray_tasks=False, steps=(3, 5), ranks=[1, 2])
    old = old_build_timeline(run=str(run), ray_tasks=False, steps=(3, 5), ranks=[1, 2])
    assert _events(json.loads((tmp_path / "steps.json").read_text())["traceEvents"]) == _events(old.events)
    assert bounded.written == len(old.events)
    from _synthetic import JOB  # rows read with their sender's number: a job filter reads the senders' jobs

    for jobs in ([JOB], ["no-such-job"]):
        chosen = export_timeline(tmp_path / "job.json", run=str(run), ray_tasks=False, jobs=jobs)
        old = old_build_timeline(run=str(run), ray_tasks=False, jobs=jobs)
        assert _events(json.loads((tmp_path / "job.json").read_text())["traceEvents"]) == _events(old.events)
        assert chosen.written == len(old.events) and (chosen.spans > 0) == (jobs == [JOB])


def test_timeline_cut_to_a_time_range(run, tmp_path):
    since, until = START + 60, START + 120
    export_timeline(tmp_path / "cut.json", run=str(run), ray_tasks=False, since=since, until=until, ranks=[0])
    events = json.loads((tmp_path / "cut.json").read_text())["traceEvents"]
    timed = [event for event in events if event["ph"] != "M"]
    assert timed and all(since * 1e6 - 1 <= event["ts"] <= until * 1e6 + 1 for event in timed if event["ph"] != "X")
    assert {event["args"].get("rank") for event in timed if event["ph"] in "Xi"} == {0}


def test_a_flight_recorder_entry_finds_its_call_as_before():
    rng = np.random.default_rng(15)
    for _ in range(200):
        starts = sorted(rng.integers(0, 40, 30) * 1_000_000)
        calls = [{"start_ns": int(start), "end_ns": None if rng.random() < 0.1 else int(start + rng.integers(0, 5) * 1e6),
                  "n": n} for n, start in enumerate(starts)]
        rng.shuffle(calls)
        for created in list(rng.integers(-5, 50, 20) * 1_000_000) + [0, None]:
            created = None if created is None else int(created)
            assert _call_at(calls, created) is old_call_at(calls, created), created


def test_collectives_read_the_newest_dump_of_each_rank(run):
    store = _open(run)
    old = match(positions_from_records([row.to_dict() for row in store.query("collectives")]))
    new = match(positions_from_records(read_collectives(store)))
    assert new.to_dict() == old.to_dict()
    assert [culprit.rank for culprit in new.culprits] == [7]
    assert "ranks 0-6,8-" in new.culprits[0].reason  # the waiting ranks as ranges, not 99 numbers


def test_the_reports_collectives_table_has_a_column_per_kind_of_rank_not_per_rank(run):
    """At 100 ranks the aligned table shares a column among the ranks whose rows read alike, as the CLI does:
    one column per way a rank's rows read, the most ranks first, the culprit alone."""
    from raysleuth.report import build_report_data, render_report

    data = build_report_data(_open(run))
    [group] = data["collectives"]["groups"]
    assert len(group["ranks"]) == 100

    def reads(rank):
        return tuple(None if (c := row["ranks"].get(rank)) is None else (c["call"], c["where"] or "", c["state"])
                     for row in group["rows"])

    kinds: dict = {}
    for rank in group["ranks"]:
        kinds.setdefault(reads(rank), []).append(rank)
    expected = sorted(kinds.values(), key=lambda ranks: (-len(ranks), ranks[0]))
    assert 2 <= len(expected) < 10
    assert [column["rank"] for column in group["columns"]] == [ranks[0] for ranks in expected]
    assert [column["header"] for column in group["columns"]] == \
        [f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks {format_ranks(ranks)}" for ranks in expected]
    assert {"header": "rank 7", "rank": 7} in group["columns"]
    page = render_report(data, title="scale", inline_js=False)
    table = page[page.index('<section id="collectives">'):page.index("</section>", page.index('id="collectives"'))]
    assert table.count("<th>") == len(expected) + 1 and len(table) < 20_000


def test_collectives_take_each_dumps_entries_as_it_is_read(run):
    """The command's read converts each dump's entries as it comes and drops its parsed arrays (half the peak
    memory at 1,000 ranks); the positions and the verdict are those of the dumps read whole."""
    from raysleuth.collectives.model import positions_from_dumps
    from raysleuth.collectives.report import _read_dumps

    store = _open(run)
    whole = positions_from_dumps(_read_dumps(store, None)[1])
    taken: dict = {}
    records, dumps = _read_dumps(store, None, taken)
    assert len(taken) == len(dumps) > 100 and not any("calls" in dump.raw for dump in dumps)
    assert not any((record["data"].get("flight_recorder") or {}).get("entries") for record in records)
    assert positions_from_dumps(dumps, taken=taken) == whole
    assert match(positions_from_dumps(dumps, taken=taken)).to_dict() == match(whole).to_dict()
    assert positions_from_dumps(dumps) != whole  # the arrays are gone: only what was taken holds the entries


def test_the_reports_collectives_are_read_as_the_command_reads_them(run):
    """The report's verdict comes from the command's streamed read (a dump at a time), and is the one the whole
    records made."""
    from raysleuth.report import _collectives, sections

    store = _open(run)
    section = _collectives(store)
    assert section == sections.collective_section(read_collectives(store))
    assert [culprit["rank"] for culprit in section["culprits"]] == [7]


def test_the_spans_one_key_sort_is_the_four_keys():
    """``totals._key_order``: one stable sort of (step, rank, phase) where the ids rise, the four keys' otherwise (ids
    out of order, keys past an int64): the same order either way, ties in id order."""
    from raysleuth.recorder.totals import _key_order

    rng = np.random.default_rng(3)
    for steps, ranks, shuffle in ((50, 40, False), (50, 40, True), (2**40, 2**30, False), (3, 1, False)):
        n = 5000
        columns = (rng.integers(-steps // 2, steps, n), rng.integers(0, ranks, n), rng.integers(0, 4, n))
        ids = np.arange(n) * 3 + 10
        if shuffle:
            ids = rng.permutation(ids)
        assert (_key_order(*columns, ids, 4) == np.lexsort((ids, *reversed(columns)))).all(), (steps, shuffle)


def test_the_reports_step_section_reads_sqls_totals_in_columns(run):
    """SQL's per-step totals take the numpy path; the section and its band are the rows' and ``_band``'s."""
    from scale_reference import old_span_section

    from raysleuth.recorder.totals import span_columns, span_rows, span_totals
    from raysleuth.report import overview, sections

    store = _open(run)
    totals = list(span_totals(store))
    assert len(totals) > 1000 and sections._span_columns(totals) is not None
    assert json.dumps(sections.span_section(totals), sort_keys=True) == json.dumps(old_span_section(totals),
                                                                                 sort_keys=True)
    columns = span_columns(store)  # the spans summed in numpy: the same totals, the same section
    assert columns is not None and span_rows(columns) == totals
    assert json.dumps(sections.span_arrays(*columns), sort_keys=True) == json.dumps(old_span_section(totals),
                                                                                  sort_keys=True)
    section = overview.span_overview(store)
    rest = {rank: {step: value for step, value in zip(section["steps"], section["totals"][rank]) if value is not None}
            for rank in section["ranks"] if rank not in section["alone"]}
    assert section["alone"] == [5] and section["band"] == overview._band(rest)  # the synthetic straggler, alone



@pytest.mark.parametrize("ranks", [2, 3, 40, 41])
def test_the_step_band_in_numpy_is_the_bands_every_step_or_some(ranks):
    """Totals in every step (numpy's own min, median, max) or with gaps (its nan* ones): ``_band`` of the same."""
    import random

    from raysleuth.report import overview

    rng = random.Random(ranks)
    steps = list(range(3, 3 + 57))
    for gaps in (0.0, 0.3):
        columns = [[None if rng.random() < gaps else round(rng.uniform(0.1, 3.0), 4) for _ in steps]
                   for _ in range(ranks)]
        columns[0][5] = columns[1][5] = None if gaps else columns[0][5]  # a step with gaps: none there in two ranks
        series = {k: {step: value for step, value in zip(steps, column) if value is not None}
                  for k, column in enumerate(columns)}
        expected = overview._band(series)
        assert overview._step_band(steps, columns) == expected
        table = np.array([[np.nan if value is None else value for value in column] for column in columns])
        assert overview._step_band(steps, [], table) == expected  # the section's own (steps, ranks) array, turned

def test_the_step_section_in_numpy_is_the_rows_dense_or_sparse():
    """Every rank in every step (the stragglers of all steps at once) and some (step by step): the rows' section."""
    from scale_reference import old_span_section

    from raysleuth.recorder.totals import totals_arrays
    from raysleuth.report import sections
    from raysleuth.report.step_arrays import _places, span_table

    rng = np.random.default_rng(5)
    for missing in (0.0, 0.05):
        totals = [(step, rank, phase, float(rng.gamma(2.0) * (3.0 if (rank, phase) == (4, "fwd") else 1.0)))
                  for step in range(60) for rank in range(12) for phase in ("bwd", "fwd", "ray.call:x")
                  if rng.random() >= missing and not (missing and (step, rank) == (7, 3))]  # a step rank 3 lacks
        expected = json.dumps(old_span_section(totals), sort_keys=True)
        section = sections.span_arrays(*totals_arrays(*zip(*totals)))
        assert section is not None and json.dumps(section, sort_keys=True) == expected, missing
        assert len(section["stragglers"]) > 10, len(section["stragglers"])
        _, table = span_table(*totals_arrays(*zip(*totals)))  # the band's: the section's totals, NaN for none
        assert {rank: [None if value != value else value for value in column]
                for rank, column in zip(section["ranks"], table.T.tolist())} == section["totals"]
        assert bool(np.isnan(table).any()) == bool(missing)
    for values in (rng.integers(-5, 40, 500), rng.integers(0, 2**40, 500), np.array([7] * 3)):  # a table, sorts
        distinct, places = _places(values, np)
        assert distinct.tolist() == np.unique(values).tolist() and (distinct[places] == values).all()


def test_the_reports_logs_of_many_ranks_are_grouped_by_message(run):
    """Past 16 ranks the report's logs are one row per message, level and logger, its ranks as ranges: the error
    of one rank first, every warning and error line counted, none of the thousand-heading page."""
    from raysleuth.report import build_report_data, render_report

    store = _open(run)
    data = build_report_data(store)
    grouped = data["log_groups"]
    held = store._db.execute("SELECT COUNT(*), COUNT(DISTINCT rank) FROM records WHERE kind = 'log' "
                             "AND level IN ('WARNING', 'ERROR', 'CRITICAL')").fetchone()
    assert data["logs"] == {} and (grouped["lines"], grouped["ranks"]) == held and held[1] > 16
    first = grouped["groups"][0]
    assert (first["level"], first["ranks"], first["count"]) == ("ERROR", "7", 1), first
    assert sum(group["count"] for group in grouped["groups"]) == grouped["lines"]
    assert all(len(group["lines"]) <= 20 for group in grouped["groups"]) and len(grouped["groups"]) < 10
    page = render_report(data, title="t", inline_js=False)
    assert "<h3>rank " not in page and "data loader slow" in page and "NCCL watchdog" in page


def test_log_groups_put_the_worst_and_the_odd_ones_out_first(tmp_path):
    """Errors before warnings; among warnings the message of two ranks before the one of twenty; a line without a
    rank counted apart; INFO left out; each group's newest 20 lines, oldest first."""
    from raysleuth import evidence
    from raysleuth.report.sections import log_groups

    store = EvidenceStore(tmp_path / "evidence.sqlite")
    for rank in range(20):
        rows = [("log", START + step, rank, step, None, "train", "WARNING",
                 {"message": f"step {step} slow by {rank * 0.1:.1f} s"}, step) for step in range(5)]
        rows.append(("log", START + 9, rank, None, None, "train", "INFO", {"message": "fine"}, 99))
        if rank in (3, 4):
            rows.append(("log", START + 8, rank, None, None, "io", "WARNING", {"message": "disk 97% full"}, 98))
        store.write_batch(identity(rank, 20), rows)
    store.write_batch({"client_id": "driver", "pid": 1}, [("log", START + 7, None, None, None, "driver", "ERROR",
                                                            {"message": "trial 2 failed"}, 0)])
    grouped = log_groups(evidence.read(store, (evidence.Log,)))
    heads = [(g["level"], g["logger"], g["template"], g["count"], g["ranks"], g["unranked"]) for g in grouped["groups"]]
    assert heads == [("ERROR", "driver", "trial <n> failed", 1, "", 1),
                     ("WARNING", "io", "disk <n>% full", 2, "3-4", 0),
                     ("WARNING", "train", "step <n> slow by <n> s", 100, "0-19", 0)], heads
    slow = grouped["groups"][2]["lines"]
    assert len(slow) == 20 and [line["time"] for line in slow] == sorted(line["time"] for line in slow)
    assert slow[-1]["time"] == START + 4 and (grouped["lines"], grouped["ranks"], grouped["left_out"]) == (103, 20, 0)


def test_the_reports_stragglers_are_marked_in_one_trace(run):
    """Every straggler's mark on the step chart is a point of one trace, each named in its hover text."""
    from raysleuth.report import build_report_data, charts

    data = build_report_data(_open(run))
    marked = data["spans"]["stragglers"][:500]
    chart = charts.charts(data)["steps"]
    assert marked and chart.count('"name":"stragglers"') == 1 and chart.count("straggler rank ") == len(marked)
    assert "straggler rank 5 " in chart


@pytest.mark.parametrize("band", [True, False], ids=["ranks-as-a-band", "every-rank-alone"])
def test_the_reports_figures_are_what_plotly_validates_them_to(run, band):
    """The charts are written as plain dicts (no plotly validation, a third of a second at 1,000 ranks): plotly's
    own validation of each, template and all, must change nothing, or the page would draw something else."""
    import copy

    import plotly.graph_objects as go

    from raysleuth.report import build_report_data, charts

    data = build_report_data(_open(run))
    if not band:  # a job of a few ranks: each drawn alone, every rank its own bar
        data["memory"]["band"], data["spans"]["band"] = None, None
        data["spans"].pop("alone", None)
    figures = charts.figures(data)
    assert set(figures) == {"memory", "steps", "phases"}
    assert any(trace["name"].endswith("(leak)") for trace in figures["memory"]["data"])
    assert any("band" in trace["name"] or "workers" in trace["name"] for trace in figures["memory"]["data"]) == band
    for name, figure in figures.items():
        html = charts.figure_html(copy.deepcopy(figure), f"chart-{name}")
        figure["layout"].update(template=charts.template(), margin=dict(charts.MARGIN), height=charts.HEIGHT)
        validated = go.Figure(copy.deepcopy(figure))
        validated.update_layout(template="plotly_white")  # what the page asked plotly for by name
        assert validated.to_plotly_json() == figure, name
        assert f'id="chart-{name}"' in html and '"plot_bgcolor":"white"' in html.replace(" ", "")  # the template


@pytest.mark.parametrize("which", ["light", "full"])
def test_the_reports_memory_curves_read_columns_as_the_rows_do(request, which):
    """The curves and band from the blocks' columns in numpy are those of SQLite's buckets read row by row."""
    from raysleuth.recorder.reading import buckets
    from raysleuth.report import overview

    store = _open(request.getfixturevalue("run" if which == "light" else "full_run"))
    first = next(store.select("memory", ("time",), limit=1))[0]
    last = next(store.select("memory", ("time",), limit=1, newest_first=True))[0]
    width = max(1.0, (last - first) / overview.BUCKETS)
    assert blocks.top(store) and blocks.rss_bucket_columns(store, width, start=first) is not None
    for leaking in (set(), {13}, {13, 150, 3}):
        drawn = overview.memory_curves(store, leaking)
        rows = overview._curve_rows(buckets(store, "memory", "rss_bytes", width, start=first), leaking, first, width)
        assert json.dumps(drawn) == json.dumps(rows), leaking
        assert drawn["band"] and len(drawn["curves"]) >= 3
        assert all(any(label.startswith(f"rank {rank} ") for label in drawn["curves"]) for rank in leaking)



@pytest.mark.parametrize("which", ["light", "full"])
def test_the_reports_curves_fold_the_blocks_its_verdicts_read(request, which, monkeypatch):
    """The report's memory section reads the blocks once (its verdicts'): its curves and band are those the curves
    draw reading every block again; a store written as a live writer writes (every rank's few samples a pass)."""
    import raysleuth.report as report
    from raysleuth.report import overview

    store = _open(request.getfixturevalue("run" if which == "light" else "full_run"))
    assert store._db.execute("SELECT count(*) FROM memory_pass_blocks").fetchone()[0] >= 1
    assert store._db.execute("SELECT count(*) FROM memory_blocks").fetchone()[0] == 0  # every sender's, a pass
    reads, original = [], blocks.read
    monkeypatch.setattr(blocks, "read", lambda *args, **kwargs: (
        reads.append((kwargs.get("ints"), kwargs.get("floats"))), original(*args, **kwargs))[1])
    section = report._memory(store)
    # no step (the page shows no MiB a step); the five numbers as floats only, RSS also as ints for the curves
    verdicts = (("id", "rank", "v0"), ("v0", "v1", "v2", "v3", "v4"))
    assert reads == [verdicts] and 13 in section["leaking_ranks"]  # the verdicts' read alone
    drawn = overview.memory_curves(store, set(section["leaking_ranks"]))
    assert reads == [verdicts, (("rank", "v0"), None)]
    assert json.dumps([section["curves"], section["band"], section["grouped"]]) == \
        json.dumps([drawn["curves"], drawn["band"], drawn["grouped"]]) and drawn["band"]

def _cut(record: dict, arrays: tuple, keep: int) -> dict:
    """A stored dump with each array cut in Python to its newest ``keep`` items per group, objects only."""
    data = record["data"]
    groups = data.get("groups")
    limit = keep * max(1, len(groups) if isinstance(groups, (dict, list)) else 1)
    for path in arrays:
        *parents, last = path.split(".")
        place = data
        for name in parents:
            place = place.get(name) if isinstance(place, dict) else None
        if isinstance(place, dict) and last in place:
            items = place[last] if isinstance(place[last], list) else []
            place[last] = [item for item in items[-limit:] if isinstance(item, dict)]
    return record


def test_the_newest_dumps_read_are_the_stored_dumps_cut_in_python(run):
    """Every worker's newest dump (and the one that is not JSON), in (time, id) order, its arrays cut as the
    records read whole are cut: a few dumps parsed at a time, the order taken from the ids."""
    from raysleuth.recorder.reading import newest_per_worker, tail_records
    from raysleuth.recorder.store import COLUMNS

    store = _open(run)
    ids = newest_per_worker(store, "collectives")
    arrays = ("calls", "flight_recorder.entries")
    fast = list(tail_records(store, ids, COLUMNS, arrays, 64))
    wanted = set(ids)
    slow = sorted((_cut(row.to_dict(), arrays, 64) for row in store.query("collectives") if row.id in wanted),
                  key=lambda record: (record["time"], record["id"]))
    assert fast == slow
    assert len(fast) > 100 and any(len(record["data"].get("calls", [])) == 64 for record in fast)


def test_the_newest_entries_are_picked_as_python_would_cut_them(tmp_path):
    """Three groups: the last 3 x 64 calls, items that are not objects left out; then a dump holding a NaN (JSON
    to Python, not to SQLite: cut all the same), one whose arrays are not arrays, and a row that is not JSON."""
    from raysleuth.recorder.reading import tail_records, tails
    from raysleuth.recorder.store import COLUMNS

    store = EvidenceStore(tmp_path / "evidence.sqlite")
    calls = [{"pg": str(n % 3), "seq": n, "text": "é\"x"} if n % 50 else n for n in range(300)]
    data = {"groups": {"0": {}, "1": {}, "2": {}}, "calls": calls, "flight_recorder": {"entries": calls[:5]},
            "detail": False}
    store.write_batch(identity(0, 1), [("collectives", START, 0, None, None, "request", "INFO", data, 0)])
    (row, items), = tails(store, [1], COLUMNS, ("calls", "flight_recorder.entries"), 64)
    assert items["calls"] == [c for c in calls[-192:] if isinstance(c, dict)]
    assert items["flight_recorder.entries"] == [c for c in calls[:5] if isinstance(c, dict)]
    rest = json.loads(row[COLUMNS.index("data") + 1])
    assert rest == {"groups": data["groups"], "flight_recorder": {}, "detail": False}
    odd = [dict(data, calls=calls + [{"pg": "0", "seq": 300, "loss": float("nan")}]),
           {"groups": [], "calls": {"0": calls[:3]}, "flight_recorder": [1, 2], "detail": True}]
    store.write_batch(identity(0, 1), [("collectives", START + 1 + k, 0, None, None, "request", "INFO", odd[k], 1 + k)
                                       for k in range(2)])
    store._db.execute("INSERT INTO records (kind, time, rank, data) VALUES ('collectives', ?, 0, '{\"calls\": [')",
                      (START + 9,))
    store._db.commit()
    nan, other, broken = list(tail_records(store, [2, 3, 4], COLUMNS, ("calls", "flight_recorder.entries"), 64))
    assert nan["data"]["calls"][:-1] == [c for c in calls[-191:] if isinstance(c, dict)]
    assert nan["data"]["calls"][-1]["seq"] == 300 and math.isnan(nan["data"]["calls"][-1]["loss"])
    assert other["data"] == {"groups": [], "calls": [], "flight_recorder": [1, 2], "detail": True}
    assert broken["data"] == {"raw": '{"calls": ['}


def test_rank_ranges_read_back_as_the_ranks():
    assert format_ranks([5, 0, 1, 2, 7, 8, 8]) == "0-2,5,7-8"
    assert parse_ranks(format_ranks(range(999))) == list(range(999))
    assert format_ranks(range(0, 100, 2), limit=3).endswith("… (50 ranks in all)")


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(list(argv))
    return code, out.getvalue()


def test_outputs_stay_short_at_a_hundred_ranks(run):
    code, text = _cli("collectives", "--run", str(run))
    assert code == 1 and re.search(r"\d+ ranks 0-6,8-\d+ ", text) and "rank 7" in text and len(text) < 6000, text[-3000:]
    code, text = _cli("timeline", "--summary", "--run", str(run))
    first = text.splitlines()[1]
    assert code == 0 and "ranks; fastest" in first and len(first) < 200, first
    code, text = _cli("memory", "--run", str(run))  # the leaker and the undecided as rows, the rest in one line
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 1 and len(lines) < 50 and "leak found: rank 13" in text, text[-3000:]
    assert re.search(r"… \d+ more worker\(s\), ranks 0-\d+,", text) and "--rank N" in text, text[-3000:]


def test_the_memory_table_fits_only_the_workers_it_draws(run):
    """Past TABLE_ROWS workers the table draws the leaks and undecided, then the GROWERS that grew most, each
    with its slope as a full report fits it; the JSON fits every worker."""
    code, text = _cli("memory", "--json", "--run", str(run))
    full = json.loads(text)["workers"]
    assert code == 1 and len(full) > TABLE_ROWS
    assert all(w["slope_bytes_per_s"] is not None for w in full if w["status"] != "not enough data")
    flagged = [w for w in full if w["leak"] or w["status"] != "ok"]
    quiet = sorted((w for w in full if w["status"] == "ok"), key=lambda w: -w["evidence"]["growth_bytes"])
    drawn = flagged + quiet[:GROWERS]
    code, text = _cli("memory", "--run", str(run))
    rows = [line.split() for line in text.splitlines()[1:] if re.match(r"\d+ ", line)]
    assert code == 1 and sorted(int(r[0]) for r in rows) == sorted(w["rank"] for w in drawn), text
    slopes = [f"{w['slope_bytes_per_s'] / 2**20:+.2f}" for w in drawn if w["slope_bytes_per_s"] is not None]
    shown = [next(token for token in row if re.fullmatch(r"[+-]\d+\.\d\d", token)) for row in rows  # MiB/s
             if any(re.fullmatch(r"[+-]\d+\.\d\d", token) for token in row)]
    assert len(slopes) >= GROWERS and sorted(shown) == sorted(slopes), (shown, slopes)


def test_a_long_summary_shows_the_rows_that_lag_most(full_run):
    code, text = _cli("timeline", "--summary", "--json", "--run", str(full_run))
    rows = json.loads(text)["summary"]
    assert code == 0 and len(rows) > SUMMARY_ROWS, len(rows)
    code, text = _cli("timeline", "--summary", "--run", str(full_run))
    lines = text.splitlines()
    steps = [int(line.split()[0]) for line in lines[2:-1]]
    by_lag = sorted(range(len(rows)), key=lambda at: (-rows[at]["lag_ratio"], -rows[at]["lag_s"], at))
    assert code == 0 and steps == sorted(rows[at]["step"] for at in by_lag[:SUMMARY_ROWS]), text
    stragglers = sum(len(row["durations"]) > 1 and row["lag_ratio"] >= 1.5 for row in rows)
    assert lines[0].startswith(f"{len(rows):,} step phases, steps {rows[0]['step']}-{rows[-1]['step']}; "
                               f"{stragglers:,} with a straggler"), lines[0]
    assert lines[1].split()[:2] == ["step", "phase"] and f"the {SUMMARY_ROWS} of {len(rows):,} step phases" in lines[-1]
    code, text = _cli("timeline", "--summary", "--all", "--run", str(full_run))
    assert code == 0 and [int(line.split()[0]) for line in text.splitlines()[1:]] == [row["step"] for row in rows]


def test_periodic_dumps_send_what_changed():
    from raysleuth.collectives import record

    record._periodic_floor.clear()

    def calls(upto: int, running: int | None) -> list[dict]:
        return [{"pg": "0", "seq": seq, "state": "started" if seq == running else "completed", "start_ns": seq,
                 "end_ns": None if seq == running else seq + 1} for seq in range(1, upto + 1)]

    def sent(upto, running):
        return [c["seq"] for c in record._delta(calls(upto, running), "calls", lambda c: c["pg"], lambda c: c["seq"],
                                                 lambda c: c["state"] == "completed")]

    assert sent(200, 200) == list(range(1, 201))  # the first: everything
    assert sent(230, None) == list(range(200, 231))  # #200 again (it completed since), then what is new
    assert sent(230, None) == list(range(223, 231))  # nothing changed: only the newest 8 (readers of one dump)
    record._periodic_floor.clear()


def test_readers_hand_the_garbage_collector_back_as_they_found_it(run):
    import gc

    from raysleuth.recorder.reading import bulk

    store = _open(run)
    assert gc.isenabled()
    memory_report(store, rank=[7])
    assert gc.isenabled()
    gc.disable()
    try:
        with bulk():
            pass
        assert not gc.isenabled()  # the caller's choice stands
    finally:
        gc.enable()
    with pytest.raises(KeyError), bulk():
        raise KeyError("x")
    assert gc.isenabled()


def test_a_bulk_read_freezes_what_it_keeps_only_in_the_command_line_process():
    """The command line answers once and exits: what a big read keeps alive is frozen out of the collector's
    walks. A process that lives on and calls ``raysleuth.cli.main`` (this test process) keeps its collector."""
    import gc
    import os
    import subprocess
    import sys

    from raysleuth.recorder import reading

    probe = ("import gc, sys; from raysleuth.recorder import reading\n"
             "if sys.argv[1] == 'cli': reading.command_line_process()\n"
             "reading.one_shot()\n"
             "with reading.bulk():\n    kept = [[n] for n in range(1000)]\n"
             "print(gc.get_freeze_count() >= 1000, gc.isenabled())")
    src = str(Path(__file__).resolve().parent.parent / "src")
    answers = [subprocess.run([sys.executable, "-c", probe, who], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": src}).stdout.split() for who in ("cli", "library")]
    assert answers == [["True", "True"], ["False", "True"]], answers
    before = gc.get_freeze_count()
    reading.one_shot()  # here: a test process calling main(); never frozen
    with reading.bulk():
        kept = [[n] for n in range(1000)]
    assert gc.get_freeze_count() == before and gc.isenabled() and len(kept) == 1000


def test_the_ranks_a_run_holds_are_walked_off_the_index(run, tmp_path):
    """``--rank``'s check reads every rank a record carries by a seek per kind and rank: the ranks SQLite's DISTINCT
    finds, on the synthetic run and on one with odd ranks (a float, a text, a null, a kind with no rank)."""
    from raysleuth.recorder.counting import ranks

    distinct = lambda store: [rank for (rank,) in store._db.execute(  # noqa: E731  (SQLite's own answer)
        "SELECT DISTINCT rank FROM entries WHERE rank IS NOT NULL ORDER BY rank")]
    store = _open(run)
    assert len(ranks(store)) == 100 + 2 and ranks(store) == distinct(store)  # and the awkward rows' ranks 150, 151
    odd = EvidenceStore(tmp_path / "odd.sqlite")
    odd.write_batch({"client_id": "c"}, [("log", START + n, rank, None, None, "train", "INFO", {"message": "x"}, n)
                                         for n, rank in enumerate([3, None, 3, 1, 12])])
    odd.write_batch({"client_id": "d"}, [("event", START, None, None, None, "rank", "INFO", {}, 0),
                                         ("span", START, 7, 1, "step", "step", None, {"duration_s": 1.0}, 1)])
    odd._db.execute("INSERT INTO records (kind, time, rank, data) VALUES ('log', ?, 7.0, '{}')", (START,))
    odd._db.execute("INSERT INTO records (kind, time, rank, data) VALUES ('crash', ?, 'two', '{}')", (START,))
    odd._db.commit()
    assert ranks(odd) == odd.ranks() == distinct(odd) == [1, 3, 7, 12, "two"]
    odd.close()
