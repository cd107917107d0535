"""``raysleuth report``: a store with real evidence → one HTML file, checked in headless Chromium.

The evidence is produced by the real features (doctor, memory samples,
consistency reports, crash capsules) and written into a real SQLite store
with per-rank identities; no Ray needed. The browser test is skipped, with
the reason, where no Chromium is installed (``make test`` tries to install it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from raysleuth.recorder.store import open_run
from raysleuth.report import generate_report
from raysleuth.report.sections import span_section

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


class BrowserCheckSkipped(pytest.PytestWarning):
    """The report's browser check could not run here (listed in pytest's warnings summary)."""


def _capsule(rank: int) -> dict:
    from raysleuth.postmortem import build_capsule

    try:
        raise ValueError(f"gradient scale became NaN on rank {rank}")
    except ValueError as error:
        return build_capsule(error, method="Trainer.update").to_dict()


def _consistency(step: int, outlier: int | None) -> dict:
    from raysleuth.consistency.report import ConsistencyReport, Mismatch

    report = ConsistencyReport(key="demo/policy-weights", consistent=outlier is None, world_size=3, step=step,
                               tensors_checked=6, arrived_ranks=[0, 1, 2])
    if outlier is not None:
        report.mismatches = [Mismatch(name="head.weight", kind="value", groups=[[0, 1], [outlier]],
                                      outlier_ranks=[outlier], first_index=[0, 3])]
    return report.to_dict()


@pytest.fixture(scope="module")
def evidence_home(tmp_path_factory) -> Path:
    from raysleuth.doctor import run_doctor
    from raysleuth.memory.sampling import read_sample

    home = tmp_path_factory.mktemp("report_home")
    store = open_run(home, "run-report-test")
    store.set_meta("run_id", "run-report-test")
    start = time.time() - 60
    doctor = run_doctor(ray=False, record=False).to_dict()
    base = read_sample(uss=False)["rss_bytes"]
    for rank in range(3):
        header = {"client_id": f"client-{rank}", "pid": 4000 + rank, "node_ip": "127.0.0.1", "hostname": "test",
                  "actor_class": "Trainer", "world_size": 3}
        rows, seq = [], 0

        def add(kind, when, data, *, step=None, name=None, level=None, phase=None):
            nonlocal seq
            rows.append((kind, when, rank, step, phase, name, level, data, seq))
            seq += 1

        for step in range(20):
            when = start + step * 2
            for phase, seconds in (("forward_backward", 0.2), ("exchange", 0.05 + (0.6 if rank == 2 else 0.0))):
                add("span", when, {"start": when, "end": when + seconds, "duration_s": seconds, "parent_id": None},
                    step=step, name=phase, phase=phase)
            growth = step * 24 * 2**20 if rank == 1 else 0
            add("memory", when, {"rss_bytes": base + growth, "uss_bytes": base + growth, "source": "watch"}, step=step)
            if step % 4 == 0:
                add("consistency", when, _consistency(step, 2 if step >= 4 else None), step=step,
                    name="demo/policy-weights", level="INFO")
        add("log", start + 5, {"message": f"rank {rank} slow batch"}, name="demo.trainer", level="WARNING", step=3)
        if rank == 1:
            add("crash", start + 30, _capsule(rank), name="ValueError", level="ERROR", step=7)
        if rank == 0:
            add("doctor", start, doctor, name="doctor")
            add("stack_report", start + 40, {"verdict": {"summary": "culprit: rank 1", "culprits": [
                {"pid": 4001, "rank": 1, "reason": "waiting in Condition.wait while 2 of 3 Trainer peers wait in get"}]},
                "groups": [{"count": 2, "ranks": [0, 2], "headline": "waiting in update → ray.get",
                            "frames": [{"function": "update", "file": "job.py", "line": 270}]}]},
                name="stacks", level="ERROR")
        store.write_batch(header, rows)
    store.close()
    return home


def test_span_section_finds_the_straggler() -> None:
    """(step, rank, phase, seconds) totals; the rule is the timeline's (1.5x the median of a step's phase)."""
    totals = [(step, rank, "update", 1.0 if rank == 2 else 0.2) for rank in range(3) for step in range(3)]
    result = span_section(totals)
    assert {s["rank"] for s in result["stragglers"]} == {2}
    assert span_section([(0, rank, "update", 0.2 if rank == 2 else 0.15) for rank in range(3)])["stragglers"] == []
    assert result["steps"] == [0, 1, 2]


def test_report_has_every_section(evidence_home: Path, tmp_path: Path) -> None:
    (tmp_path / "trace.json").write_text('{"traceEvents": []}')
    result = generate_report(tmp_path / "report.html", home=evidence_home)
    text = result.path.read_text()
    assert result.run_id == "run-report-test"
    assert result.trace_path == tmp_path / "trace.json"
    assert 'href="trace.json"' in text
    assert all(result.sections[name] > 0 for name in
               ("doctor", "stacks", "consistency", "memory", "crashes", "logs", "spans")), result.sections
    assert result.sections["tasks"] == 0 and "No task evidence in this run" in text
    assert "MISMATCH" in text and "head.weight" in text
    assert "gradient scale became NaN on rank 1" in text
    assert "LEAK" in text  # rank 1's memory grows 24 MiB a step
    # self-contained: no external scripts or stylesheets
    assert not re.search(r'<script[^>]+src=', text) and not re.search(r'<link[^>]+href="http', text)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _chrome_flags(profile: Path) -> list[str]:
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
            "--hide-scrollbars", "--virtual-time-budget=10000"]


def test_report_renders_in_chromium(evidence_home: Path, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:  # said in the final summary too, so a green run does not hide it
        message = "Chromium is not installed (apt-get install -y chromium); the report's browser check did not run"
        warnings.warn(BrowserCheckSkipped(message), stacklevel=1)
        pytest.skip(message)
    result = generate_report(tmp_path / "report.html", home=evidence_home)
    url = result.path.resolve().as_uri()
    dump = subprocess.run([browser, *_chrome_flags(tmp_path / "profile"), "--enable-logging=stderr", "--v=0",
                           "--dump-dom", url], capture_output=True, text=True, timeout=120)
    dom = dump.stdout
    assert 'data-rs-loaded="1"' in dom, dump.stderr[-2000:]
    console_errors = [line for line in dump.stderr.splitlines() if "CONSOLE" in line and "ERROR" in line.upper()]
    page_errors = re.search(r'<html[^>]*data-rs-errors="(\d+)"', dom)
    shown = re.search(r'<div id="rs-errors"[^>]*>([^<]*)<', dom)
    assert page_errors is None and not console_errors, (console_errors, shown and shown.group(1))
    charts = int(re.search(r'data-rs-charts="(\d+)"', dom).group(1))
    drawn = int(re.search(r'data-rs-drawn="(\d+)"', dom).group(1))
    assert charts == 3 and drawn == charts, (charts, drawn)
    assert dom.count("<svg") >= charts
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    subprocess.run([browser, *_chrome_flags(tmp_path / "profile2"), "--window-size=1400,3000",
                    f"--screenshot={shot}", url], capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_report_of_a_sparse_run_says_what_is_missing(tmp_path: Path) -> None:
    store = open_run(tmp_path / "home", "sparse")
    store.set_meta("run_id", "sparse")
    store.write_batch({"client_id": "c", "pid": 1}, [("log", time.time(), 0, 1, None, "x", "ERROR",
                                                       {"message": "only a log"}, 0)])
    store.close()
    result = generate_report(tmp_path / "r.html", home=tmp_path / "home")
    text = result.path.read_text()
    for phrase in ("No doctor results", "No stack reports", "No task evidence", "No consistency checks",
                   "No memory samples", "No crashes captured", "No spans with steps", "No Perfetto trace"):
        assert phrase in text
    assert "only a log" in text


def test_a_skipped_browser_check_shows_in_the_summary(tmp_path: Path) -> None:
    """Without Chromium on PATH the browser test skips, and the run's summary says so."""
    import os
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bin_dir), "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           f"{__file__}::test_report_renders_in_chromium"], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    assert "1 skipped" in done.stdout, done.stdout[-2000:]
    assert "warnings summary" in done.stdout and "BrowserCheckSkipped" in done.stdout, done.stdout[-2000:]
