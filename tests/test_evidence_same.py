"""The report and the reading commands say what they said before the evidence package, on the same store.

The store holds the rows the real features wrote (``tests/data/evidence/make_run.py``: three rank
processes with ``rs.step``, ``rs.span``, ``rs.get_logger``, ``rs.capture_crashes``, ``rs.memory.watch``...,
dumped as stored); ``tests/data/evidence/before.json`` is what ``tests/evidence_outputs.py`` printed for it
on commit f51b333, before ``raysleuth.evidence`` (see that file's docstring for the command). No Ray.

Two changes are on purpose and checked apart: the report's stragglers follow the timeline's rule now
(``timeline.summary.stragglers_of``: per step and phase, the slowest rank at 1.5x the median or more,
where the report had its own 1.5x rule on step totals), and the consistency rows lost a ``ranks`` key
that was always empty. Two are of form only: the charts' JSON keys come in another order (their values are
compared), and the memory section's data holds the groups a page of more than 16 workers shows (empty here).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import evidence_outputs

BEFORE = json.loads((evidence_outputs.DATA / "before.json").read_text())


@pytest.fixture(scope="module")
def now(tmp_path_factory) -> dict:
    monkeypatch = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("evidence_same")
    monkeypatch.setenv("RAYSLEUTH_HOME", str(home))
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    monkeypatch.delenv("COLUMNS", raising=False)
    import time

    time.tzset()
    try:
        yield json.loads(json.dumps(evidence_outputs.outputs(Path(home)), sort_keys=True))
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("command", sorted(evidence_outputs.COMMANDS))
def test_command_says_the_same(now: dict, command: str) -> None:
    assert now[command] == BEFORE[command]


def _without_changes(data: dict) -> dict:
    data = json.loads(json.dumps(data))
    data["spans"].pop("stragglers")
    for key in ("quiet_groups", "grew_most"):  # past 16 workers only: the quiet ones as groups (three here)
        assert data["memory"].pop(key, []) == []
    for verdict in data["memory"]["verdicts"]:  # what the groups are made of
        verdict.pop("kind", None), verdict.pop("growth", None)
    for row in data["consistency"]:
        row.pop("ranks", None)
    return data


def test_report_data_is_the_same(now: dict) -> None:
    assert _without_changes(now["report data"]) == _without_changes(BEFORE["report data"])
    assert now["report data"]["crashes"] and now["report data"]["memory"]["leaking_ranks"] == [1]


def test_report_stragglers_are_the_timelines(now: dict) -> None:
    """The report names the step phases that ``timeline --summary`` (before) marked: lag 1.5x or more."""
    timeline = json.loads(BEFORE["timeline --summary --json"]["stdout"])["summary"]
    marked = {(row["step"], row["phase"], int(row["slowest"])) for row in timeline
              if len(row["durations"]) > 1 and row["lag_ratio"] >= 1.5}
    reported = {(row["step"], row["phase"], row["rank"]) for row in now["report data"]["spans"]["stragglers"]}
    assert reported == marked and {rank for _, _, rank in marked} >= {2}


def _steps_cut(html: str) -> str:
    return re.sub(r'<section id="steps">.*?</section>', "", html, flags=re.S)


def _figures_read(html: str) -> str:
    """Each chart's ``Plotly.newPlot(id, data, layout, config)`` written back with sorted keys: the report writes
    its figures as plain dicts (``report.charts``), whose keys come in another order than plotly's own."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while (start := html.find("Plotly.newPlot(", at)) >= 0:
        out.append(html[at:start + len("Plotly.newPlot(")])
        at = start + len("Plotly.newPlot(")
        arguments = []
        for _ in range(4):
            at += len(html[at:]) - len(html[at:].lstrip(" \n,"))
            value, at = decoder.raw_decode(html, at)
            arguments.append(json.dumps(value, sort_keys=True))
        out.append(", ".join(arguments))
    return "".join(out) + html[at:]


def test_report_page_is_the_same(now: dict) -> None:
    html, before = _figures_read(_steps_cut(now["report html"])), _figures_read(_steps_cut(BEFORE["report html"]))
    assert html.count("Plotly.newPlot(") == before.count("Plotly.newPlot(") == 1  # the memory chart
    assert html == before
