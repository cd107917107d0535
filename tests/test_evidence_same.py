"""The report and the reading commands say what they said before the evidence package, on the same store.

The store holds the rows the real features wrote (``tests/data/evidence/make_run.py``: three rank
processes with ``rs.step``, ``rs.span``, ``rs.get_logger``, ``rs.capture_crashes``, ``rs.memory.watch``...,
dumped as stored); ``tests/data/evidence/before.json`` is what ``tests/evidence_outputs.py`` printed for it
on commit f51b333, before ``raysleuth.evidence`` (see that file's docstring for the command). No Ray.

Two changes are on purpose and checked apart: the report's stragglers follow the timeline's rule now
(``timeline.summary.stragglers_of``: per step and phase, the slowest rank at 1.5x the median or more,
where the report had its own 1.5x rule on step totals), and the consistency rows lost a ``ranks`` key
that was always empty.
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


def test_report_page_is_the_same(now: dict) -> None:
    assert _steps_cut(now["report html"]) == _steps_cut(BEFORE["report html"])
