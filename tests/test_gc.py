"""``raysleuth gc`` removes old runs under RAYSLEUTH_RETAIN; the newest run and busy runs always stay."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time

import pytest

from raysleuth import runtime
from raysleuth.cli import main
from raysleuth.errors import UsageError
from raysleuth.recorder.retention import parse_retain
from raysleuth.recorder.store import open_run


def _runs(home, ages_days: dict[str, float]) -> None:
    now = time.time()
    for run_id, age in ages_days.items():
        store = open_run(home, run_id)
        store.add("log", {"message": "x" * 20_000}, level="WARNING")
        store.close()
        for path in (home / "runs" / run_id).iterdir():
            os.utime(path, (now - age * 86400, now - age * 86400))
        (home / "spool" / run_id).mkdir(parents=True, exist_ok=True)
    (home / "runs" / "latest").write_text("newest")


def _gc(home, *argv) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["gc", "--home", str(home), "--json", *argv])
    return code, json.loads(out.getvalue())


def test_age_and_size(tmp_path, monkeypatch):
    _runs(tmp_path, {"old": 30, "week": 6, "newest": 40})
    code, plan = _gc(tmp_path, "--retain", "7d", "--dry-run")
    assert code == 0 and plan["removed"] == ["old"] and (tmp_path / "runs" / "old").exists()
    monkeypatch.setenv("RAYSLEUTH_RETAIN", "7d")
    runtime.reload_settings()
    try:
        code, done = _gc(tmp_path)
    finally:
        monkeypatch.delenv("RAYSLEUTH_RETAIN")
        runtime.reload_settings()
    assert code == 0 and done["removed"] == ["old"] and done["freed_bytes"] > 0
    assert not (tmp_path / "runs" / "old").exists() and not (tmp_path / "spool" / "old").exists()
    assert (tmp_path / "runs" / "newest").exists() and (tmp_path / "runs" / "week").exists()  # newest: despite its age
    code, done = _gc(tmp_path, "--retain", "1KB")
    assert done["removed"] == ["week"] and (tmp_path / "runs" / "newest").exists()


def test_no_policy_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        parse_retain("7 parsecs")
    assert parse_retain("7d,20GB").max_bytes == 20 * 10**9 and parse_retain(" ") is None
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["gc", "--home", str(tmp_path)]) == 2
