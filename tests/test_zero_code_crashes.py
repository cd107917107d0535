"""`raysleuth run` on an unmodified job in which every kind of worker code fails (tests/victims/zero_code_crashes.py).

One run in light mode, one with RAYSLEUTH_MODE=off: the job's own output
must be the same line for line; light mode must leave a capsule for the
task, the actor ``__init__``, the async method and the thread, and a
fatal-signal file with the Python stack and rank of the worker that
segfaulted; off must leave nothing.
"""

from __future__ import annotations

import re
import shutil

import pytest
from zero_code_run import run_job

from raysleuth.worker_setup import parse_header

EXPECTED_OUTPUT = [
    "load_shard: FileNotFoundError: shard missing: /data/shard-7.parquet",
    "tokenizer: died in __init__: True",
    "reward.score: RuntimeError: cannot score 'hello'",
    "reward.start_prefetch: prefetch finished",
    "rollout: worker died",
]


def job_lines(stdout: str) -> list[str]:
    """The job's own lines. Ray prints its own into the same stdout from another thread (e.g.
    "(raylet) A worker died...", with worker ids), sometimes on the same line as the job's."""
    return re.findall(r"(?:load_shard|tokenizer|reward\.score|reward\.start_prefetch|rollout): [^\n\x1b]*", stdout)


@pytest.fixture(scope="module")
def light(tmp_path_factory):
    job = run_job("zero_code_crashes.py", tmp=tmp_path_factory.mktemp("light"))
    yield job
    shutil.rmtree(job.ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def off(tmp_path_factory):
    job = run_job("zero_code_crashes.py", tmp=tmp_path_factory.mktemp("off"), mode="off")
    yield job
    shutil.rmtree(job.ray_tmp, ignore_errors=True)


def test_the_job_runs_as_written_and_its_errors_reach_the_driver_unchanged(light):
    assert light.returncode == 0, light.stderr[-3000:]
    assert job_lines(light.stdout) == EXPECTED_OUTPUT


def test_every_escaping_exception_leaves_a_capsule(light):
    crashes = {record.name: record for record in light.store().query("crash")}
    assert {"load_shard", "Tokenizer.__init__", "RewardModel.score", "RewardModel.thread:prefetcher"} <= set(crashes)
    task = crashes["load_shard"].data
    assert task["exception_type"] == "FileNotFoundError" and "shard-7" in task["message"]
    secret_frame = next(frame for frame in task["frames"] if frame.get("function") == "load_shard")
    assert secret_frame["locals"]["api_key"] == "<redacted>"
    assert crashes["Tokenizer.__init__"].data["exception_type"] == "ValueError"
    assert crashes["Tokenizer.__init__"].actor_class == "Tokenizer"
    assert crashes["RewardModel.score"].data["exception_type"] == "RuntimeError"
    assert crashes["RewardModel.thread:prefetcher"].data["exception_type"] == "ConnectionError"
    listed = light.crashes_cli()  # and the user finds them with the CLI, after the job is gone
    assert {"FileNotFoundError", "ValueError", "RuntimeError", "ConnectionError"} <= {c["exception_type"] for c in listed}


def test_each_worker_says_what_was_installed(light):
    events = light.store().query("event", name="instrumented")
    assert events, "no worker reported its setup"
    for event in events:
        assert event.data["errors"] == [] and event.level == "INFO"
        assert {"fatal_signal_file", "crash_capture", "control", "log_shipping"} <= set(event.data["installed"])
        assert event.data["mode"] == "light"


def test_warnings_are_shipped_and_memory_is_sampled(light):
    store = light.store()
    logs = [record for record in store.query("log") if record.name == "reward.cache"]
    assert [(record.level, record.data["message"]) for record in logs] == \
        [("WARNING", "prefetch failed; scoring without the cache")]
    assert logs[0].actor_class == "RewardModel"
    samples = store.query("memory")
    assert samples and all(sample.data["source"] == "watch" and sample.data["rss_bytes"] > 0 for sample in samples)


def test_the_segfault_leaves_a_fatal_signal_file_with_stack_and_rank(light):
    dead = []
    for path in light.fatal_files():
        text = path.read_text(errors="replace")
        if "Segmentation fault" in text:
            dead.append((path, text))
    assert len(dead) == 1, [p.name for p in light.fatal_files()]
    path, text = dead[0]
    fields = parse_header(text)
    assert path.name == f"raysleuth-fatal-{fields['pid']}.log"
    assert fields["rank"] == "1"  # the rank verl-style runtime_env gave it
    assert fields["job_id"] and fields["job_id"] != "-"
    assert 'zero_code_crashes.py", line' in text and "in generate" in text  # the Python stack, file and line


def test_mode_off_changes_nothing_and_records_nothing(off, light):
    assert off.returncode == 0, off.stderr[-3000:]
    assert job_lines(off.stdout) == job_lines(light.stdout)  # same output with and without instrumentation
    assert not off.has_evidence()
    assert off.fatal_files() == []
