"""Rank-aware logs, ``raysleuth logs``, aggregation and monitoring modes.

Pure logic (templates, rank ranges, aggregation, --since/--step parsing)
runs without Ray; the rest uses 4 real actors on the 2-node test cluster,
the real writer and SQLite, and the CLI in-process or as a subprocess.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from raysleuth import runtime
from raysleuth.errors import UsageError
from raysleuth.logs import (
    LogLine,
    RankFilter,
    aggregate,
    format_ranks,
    memory_alert,
    parse_ranks,
    parse_since,
    parse_step_range,
    split_template,
)

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------- pure logic


def test_templates_and_rank_ranges():
    assert split_template("step 12 loss=0.25 lr=1e-4") == ("step <n> loss=<n> lr=<n>", ("12", "0.25", "1e-4"))
    assert split_template("layer0_weight ok") == ("layer0_weight ok", ())
    assert format_ranks([7, 0, 1, 2, 3, 4, 5]) == "0-5,7"
    assert format_ranks([3]) == "3"
    assert parse_ranks("0-5,7") == [0, 1, 2, 3, 4, 5, 7]
    with pytest.raises(UsageError):  # the CLI's one parser (raysleuth.options), re-exported here
        parse_ranks("5-2")


def test_aggregation_shows_the_rank_that_differs_apart():
    items = [LogLine(message=f"step 10 loss={0.5 if rank != 6 else 7.25}", rank=rank, step=10, time=rank)
             for rank in range(8)]
    lines = aggregate(items)
    assert [line.text() for line in lines] == [
        "[ranks 0-5,7] step 10 loss=0.5",
        "[rank 6] step 10 loss=7.25  <- differs",
    ]
    assert lines[0].count == 7 and not lines[0].differs and lines[1].differs and lines[1].group_size == 8


def test_aggregation_treats_a_rank_number_as_a_label_not_a_difference():
    items = [LogLine(message=f"rank {rank} ready", rank=rank, time=rank) for rank in range(4)]
    lines = aggregate(items)
    assert len(lines) == 1 and lines[0].ranks == [0, 1, 2, 3] and lines[0].message == "rank {rank} ready"


def test_aggregation_keeps_steps_and_writers_without_rank_apart():
    items = [LogLine(message="loss=1.0", rank=0, step=1, time=1), LogLine(message="loss=1.0", rank=1, step=2, time=2),
             LogLine(message="loss=1.0", rank=None, pid=7, hostname="h", step=1, time=3)]
    lines = aggregate(items)
    assert [(line.step, line.label) for line in lines] == [(1, "rank 0; pid 7@h"), (2, "rank 1")]


def test_since_step_and_level_parsing():
    assert parse_since("10m", now=1000.0) == 400.0
    assert parse_since("2h", now=10_000.0) == 2800.0
    assert parse_since(None) is None
    assert parse_step_range("100-120") == (100, 120)
    assert parse_step_range("100") == (100, 100)
    assert parse_step_range("100-") == (100, None)
    for bad in ("yesterday-ish",):
        with pytest.raises(UsageError):
            parse_since(bad)
    for bad in ("a-b", "120-100"):
        with pytest.raises(UsageError):
            parse_step_range(bad)


def test_memory_alert_threshold():
    assert memory_alert({"host": 0.5}, 0.9) is None
    assert memory_alert({"host": 0.95, "gpu": 0.2}, 0.9) == "memory above 90% of capacity: host 95%"


def test_rank_filter_on_a_users_own_logger():
    runtime.set_rank(5, 8)
    try:
        seen = []

        class Keep(logging.Handler):
            def emit(self, record):
                seen.append(record)

        logger = logging.getLogger(f"user.{uuid.uuid4().hex}")
        logger.propagate = False
        handler = Keep()
        handler.addFilter(RankFilter())
        logger.addHandler(handler)
        logger.warning("hello")
        record = seen[0]
        assert (record.rank, record.world_size, record.rank_label) == (5, 8, "rank 5")
        assert record.pid > 0 and hasattr(record, "step") and hasattr(record, "phase") and hasattr(record, "node")
    finally:
        runtime._explicit_rank = None
        runtime._rank_cache = None
        runtime._identity = None


def test_get_logger_is_a_stdlib_logger_that_takes_rank(tmp_path):
    import raysleuth as rs

    logger = rs.get_logger(f"plain.{uuid.uuid4().hex}", console=False)
    assert isinstance(logger, logging.Logger)
    assert rs.get_logger(logger.name) is logger and logging.getLogger(logger.name) is logger
    assert len(logger.handlers) == len(rs.get_logger(logger.name).handlers)  # nothing added twice
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    logger.addHandler(Keep())
    logger.info("x=%d", 3, rank=4, step=9, loss=0.5)
    assert (seen[0].rank, seen[0].step, seen[0].loss, seen[0].getMessage()) == (4, 9, 0.5, "x=3")


def test_debug_decorator_redacts_and_times(tmp_path):
    import raysleuth as rs

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    logger = rs.get_logger(f"debug.{uuid.uuid4().hex}", console=False)
    logger.addHandler(Keep())

    @rs.debug_decorator(logger=logger)
    def step(batch, api_key, notes):
        return len(batch)

    assert step([1, 2, 3], api_key="sk-abcdefghijklmnop1234567890", notes="x" * 5000) == 3
    message = seen[-1].getMessage()
    assert "api_key=<redacted>" in message and "sk-abc" not in message
    assert "took" in message and "memory" in message and "(+4802 chars)" in message

    @rs.debug_decorator(logger=logger)
    def fails():
        raise KeyError("gone")

    with pytest.raises(KeyError):
        fails()
    assert seen[-1].levelno == logging.ERROR and "raised KeyError" in seen[-1].getMessage()


def test_mode_configs_and_off_makes_logging_a_no_op(tmp_path):
    from raysleuth import monitoring
    from raysleuth.logs import ship_level

    assert monitoring.mode_config("light").log_level == "WARNING"
    assert monitoring.mode_config("light").memory_interval_s == 10.0
    assert monitoring.mode_config("full").memory_interval_s == 1.0 and monitoring.mode_config("full").detailed_tracing
    with pytest.raises(UsageError):
        monitoring.mode_config("loud")
    try:
        monitoring.enable_lightweight_monitoring()
        assert runtime.settings().mode == "light" and ship_level() == logging.WARNING
        monitoring.enable_full_debugging()
        assert runtime.settings().mode == "full" and ship_level() == logging.INFO
        monitoring.disable_monitoring()
        assert runtime.settings().mode == "off"
        # off: the store handler ships nothing (checked on the handler directly: no Ray needed)
        from raysleuth.logs.loggers import StoreHandler
        from raysleuth.recorder import RecordClient, StoreSink, reset_client
        from raysleuth.recorder.store import EvidenceStore

        store = EvidenceStore(tmp_path / "e.sqlite")
        old = reset_client(RecordClient(StoreSink(store), spool_dir=tmp_path))
        try:
            handler = StoreHandler()
            handler.handle(logging.makeLogRecord({"msg": "quiet", "levelno": logging.ERROR, "levelname": "ERROR"}))
            monitoring.enable_full_debugging()
            handler.handle(logging.makeLogRecord({"msg": "heard", "levelno": logging.ERROR, "levelname": "ERROR"}))
            from raysleuth.recorder import get_client

            assert get_client().flush(10)
            assert [r.data["message"] for r in store.query("log")] == ["heard"]
        finally:
            reset_client(old)
    finally:
        monitoring.disable_monitoring()  # stops the memory sampler and detailed tracing these switches started
        runtime.reload_settings()
        from raysleuth.logs import refresh_levels

        refresh_levels()


# ------------------------------------------------------- on a real cluster


@pytest.fixture(scope="module")
def chatty(ray_cluster):
    """4 ranks that logged: rank 2's loss differs; rank 3 warned; all printed."""
    import ray

    from raysleuth import cluster
    from victims.chatty_ranks import ChattyRank

    token = uuid.uuid4().hex[:10]
    actor = ray.remote(num_cpus=0.1)(ChattyRank)
    ranks = [actor.options(name=f"chatty_rank{rank}").remote(rank, 4) for rank in range(4)]
    ray.get([handle.train_step.remote(7, 0.5 if rank != 2 else 3.25, token) for rank, handle in enumerate(ranks)],
            timeout=120)
    ray.get(ranks[3].warn.remote(f"grad norm exploding {token}"), timeout=60)
    ray.get([handle.shout.remote(f"hello-{token}") for handle in ranks], timeout=60)
    assert all(ray.get([handle.flush.remote() for handle in ranks], timeout=60))
    yield {"ranks": ranks, "token": token, "run": cluster.session_name(), "home": str(ray_cluster.home),
           "address": ray_cluster.address}
    for handle in ranks:
        ray.kill(handle)


def _cli_json(capsys, *args) -> list:
    from raysleuth.cli import main

    capsys.readouterr()
    code = main(["logs", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_logs_rank_json_returns_only_that_rank_with_all_fields(chatty, capsys):
    records = _cli_json(capsys, "--rank", "2", "--json", "--run", chatty["run"], "--home", chatty["home"])
    assert records and {record["rank"] for record in records} == {2}
    mine = [record for record in records if chatty["token"] in record["message"]]
    assert len(mine) == 1
    record = mine[0]
    assert record["message"] == f"step 7 loss=3.2500 {chatty['token']}"
    assert record["world_size"] == 4 and record["step"] == 7 and record["level"] == "INFO"
    assert record["pid"] and record["node_id"] and record["node_ip"] and record["actor_id"]
    assert record["actor_class"] == "ChattyRank" and record["actor_name"] == "chatty_rank2"
    assert record["name"] == "victims.chatty" and record["funcName"] == "train_step" and record["lineno"]


def test_logs_level_and_grep_filter(chatty, capsys):
    common = ["--json", "--run", chatty["run"], "--home", chatty["home"]]
    warnings = _cli_json(capsys, "--level", "WARNING", *common)
    assert warnings and all(record["level"] in ("WARNING", "ERROR", "CRITICAL") for record in warnings)
    assert any(record["message"] == f"grad norm exploding {chatty['token']}" and record["rank"] == 3
               for record in warnings)
    found = _cli_json(capsys, "--grep", f"loss=3\\.25.*{chatty['token']}", *common)
    assert [record["rank"] for record in found] == [2]
    steps = _cli_json(capsys, "--step", "7", "--grep", chatty["token"], *common)
    assert sorted(record["rank"] for record in steps) == [0, 1, 2, 3]
    assert _cli_json(capsys, "--step", "8-9", "--grep", chatty["token"], *common) == []


def test_logs_bad_input_is_one_line_exit_2(chatty, capsys):
    from raysleuth.cli import main

    assert main(["logs", "--since", "last tuesday", "--run", chatty["run"], "--home", chatty["home"]]) == 2
    assert "--since" in capsys.readouterr().err


def test_logs_aggregate_shows_the_rank_with_a_different_loss(chatty, capsys):
    lines = _cli_json(capsys, "--aggregate", "--grep", f"loss=.*{chatty['token']}", "--json",
                      "--run", chatty["run"], "--home", chatty["home"])
    assert [(line["label"], line["differs"]) for line in lines] == [("ranks 0-1,3", False), ("rank 2", True)]
    assert "loss=3.2500" in lines[1]["text"] and "loss=0.5000" in lines[0]["text"]


def test_logger_info_with_rank_keyword_sets_the_rank(chatty, capsys):
    import ray

    token = uuid.uuid4().hex[:10]
    handle = chatty["ranks"][0]
    ray.get(handle.log_with_rank.remote(f"seed-style {token}", 11), timeout=60)
    assert ray.get(handle.flush.remote(), timeout=60)
    records = _cli_json(capsys, "--grep", token, "--json", "--run", chatty["run"], "--home", chatty["home"])
    assert [record["rank"] for record in records] == [11]


def test_logs_follow_sees_a_record_written_after_it_started(chatty):
    import ray

    token = uuid.uuid4().hex[:10]
    follower = subprocess.Popen(
        [str(ROOT / ".venv/bin/raysleuth"), "logs", "--follow", "--json", "--grep", token, "--max-records", "1",
         "--timeout", "90", "--run", chatty["run"], "--home", chatty["home"]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    handle = chatty["ranks"][1]
    try:
        deadline = time.time() + 90
        while follower.poll() is None and time.time() < deadline:
            ray.get(handle.warn.remote(f"late news {token}"), timeout=30)
            ray.get(handle.flush.remote(), timeout=30)
            try:
                follower.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    line = json.loads(out.strip().splitlines()[0])
    assert line["message"] == f"late news {token}" and line["rank"] == 1 and line["level"] == "WARNING"


def test_ray_log_pull_returns_print_output_labelled_with_rank(chatty, capsys):
    from raysleuth.cli import main

    common = ["--ray", "--rank", "1", "--json", "--address", chatty["address"], "--run", chatty["run"],
              "--home", chatty["home"]]
    deadline = time.time() + 90
    while True:  # Ray writes the worker's .out file asynchronously
        capsys.readouterr()
        code = main(["logs", *common])
        pulled = json.loads(capsys.readouterr().out)
        out = next(item for item in pulled if item["stream"] == "out")
        found = any(f"hello-{chatty['token']} from rank 1" in text for text in out["lines"])
        if (found and code == 0) or time.time() > deadline:
            break
        time.sleep(1)
    assert code == 0, [(item["stream"], item["error"]) for item in pulled]
    assert out["rank"] == 1 and out["label"] == "rank 1" and out["actor_id"]
    assert any(f"hello-{chatty['token']} from rank 1" in text for text in out["lines"])
    assert not any(f"hello-{chatty['token']} from rank 2" in text for text in out["lines"])


def test_ray_log_pull_unknown_rank_is_worker_not_found(chatty, capsys):
    from raysleuth.cli import main

    code = main(["logs", "--ray", "--rank", "97", "--address", chatty["address"], "--run", chatty["run"],
                 "--home", chatty["home"]])
    assert code == 2 and "rank 97" in capsys.readouterr().err


def test_lightweight_monitoring_switches_remote_workers(chatty, capsys):
    import ray

    from raysleuth import monitoring

    handle = chatty["ranks"][0]
    token = uuid.uuid4().hex[:10]
    try:
        result = monitoring.enable_lightweight_monitoring(workers=[handle])
        assert result.ok and result.workers[0]["ok"]
        assert ray.get(handle.settings.remote(), timeout=60) == {"mode": "light", "log_level": "WARNING"}
        ray.get(handle.train_step.remote(8, 0.5, token), timeout=60)  # INFO: not shipped in light mode
        ray.get(handle.warn.remote(f"light warning {token}"), timeout=60)
        assert ray.get(handle.flush.remote(), timeout=60)
        records = _cli_json(capsys, "--grep", token, "--json", "--run", chatty["run"], "--home", chatty["home"])
        assert [record["message"] for record in records] == [f"light warning {token}"]
    finally:
        monitoring.disable_monitoring()  # stops what the switch started in this process
        ray.get(handle.__ray_call__.remote(monitoring._apply_in_worker, "light", "INFO"), timeout=60)
        runtime.reload_settings()
        from raysleuth.logs import refresh_levels

        refresh_levels()


def test_install_log_shipping_is_idempotent_and_ships_a_plain_logger(tmp_path):
    import raysleuth as rs
    from raysleuth.recorder import RecordClient, StoreSink, get_client, reset_client
    from raysleuth.recorder.store import EvidenceStore

    store = EvidenceStore(tmp_path / "e.sqlite")
    old = reset_client(RecordClient(StoreSink(store), spool_dir=tmp_path))
    target = logging.getLogger(f"library.{uuid.uuid4().hex}")
    target.propagate = False
    try:
        rs.install_log_shipping(target)
        rs.install_log_shipping(target)
        assert sum(type(h).__name__ == "StoreHandler" for h in target.handlers) == 1
        target.info("from a library that never heard of raysleuth")
        assert get_client().flush(10)
        [record] = store.query("log")
        assert record.name == target.name and record.level == "INFO"
        assert record.data["message"] == "from a library that never heard of raysleuth"
    finally:
        from raysleuth.logs import uninstall_log_shipping

        uninstall_log_shipping(target)
        reset_client(old)


def test_distributed_logger_memory_alert_names_rank_and_phase():
    import raysleuth as rs
    from raysleuth.logs import MemoryReading

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    logger = rs.DistributedLogger(f"alert.{uuid.uuid4().hex}", alert_threshold=0.8, monitor_memory=False,
                                  console=False)
    logger.addHandler(Keep())  # the stdlib surface is the underlying logger's
    token = runtime.set_phase("rollout")
    try:
        full = MemoryReading(host_used_bytes=95, host_total_bytes=100)
        assert logger.check_memory(full) == "memory above 80% of capacity: host 95%"
        assert logger.check_memory(full) is not None and len(seen) == 1  # once per crossing
        assert logger.check_memory(MemoryReading(host_used_bytes=10, host_total_bytes=100)) is None
        logger.check_memory(full)
        assert len(seen) == 2
    finally:
        runtime._phase.reset(token)
        logger.close()
    assert seen[0].levelno == logging.WARNING and "phase rollout" in seen[0].getMessage()
    assert "rank" in seen[0].getMessage() and seen[0].phase == "rollout"


def test_distributed_logger_aggregates_the_runs_records(chatty):
    import raysleuth as rs

    logger = rs.DistributedLogger("victims.chatty", monitor_memory=False, console=False)
    try:
        lines = [line for line in logger.aggregated(run=chatty["run"], home=chatty["home"])
                 if chatty["token"] in line.message and "loss" in line.message]
    finally:
        logger.close()
    assert [(line.ranks, line.differs) for line in lines] == [([0, 1, 3], False), ([2], True)]
