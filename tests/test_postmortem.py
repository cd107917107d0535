"""Crash capsules: real Ray actors crash under @rs.capture_crashes; the capsule lands in real SQLite.

The integration tests use the session's 2-node cluster (``ray_cluster``);
the redaction and capsule tests at the end run without Ray.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from raysleuth import postmortem
from raysleuth.postmortem import REDACTED, redact, redact_text

REPO = Path(__file__).resolve().parents[1]


def _tag() -> str:
    return uuid.uuid4().hex[:10]


def _capsule(home: Path, tag: str, timeout: float = 60.0):
    """The crash record whose message carries ``tag`` (polls the store)."""
    from raysleuth.errors import StoreNotFound
    from raysleuth.recorder import open_store

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            store = open_store(home=home)
        except StoreNotFound:
            time.sleep(0.2)
            continue
        try:
            for record in store.query("crash"):
                if tag in record.data.get("message", ""):
                    return record
        finally:
            store.close()
        time.sleep(0.2)
    raise AssertionError(f"no crash capsule with {tag!r} under {home}")


def _frame(record, function_suffix: str) -> dict:
    frames = [frame for frame in record.data["frames"] if frame["function"].endswith(function_suffix)]
    assert frames, [frame["function"] for frame in record.data["frames"]]
    return frames[-1]


# ------------------------------------------------------------ real cluster


def test_crashing_actor_method_leaves_capsule_and_reraises_unchanged(ray_cluster):
    import ray

    from victims.crashing_actor import CUDA_OOM, RemoteOverCapture

    tag = _tag()
    actor = RemoteOverCapture.remote(3)
    try:
        assert ray.get(actor.whoami.remote(), timeout=120) == 3
        with pytest.raises(RuntimeError) as caught:
            ray.get(actor.step.remote(7, tag), timeout=120)
        # Unchanged for the caller: Ray's RayTaskError that is also the original class, same message.
        assert isinstance(caught.value, ray.exceptions.RayTaskError)
        assert type(caught.value.cause) is RuntimeError
        assert caught.value.cause.args == (f"{CUDA_OOM} [{tag}]",)

        record = _capsule(ray_cluster.home, tag)
        data = record.data
        assert record.kind == "crash" and record.rank == 3 and data["rank"] == 3 and data["world_size"] == 4
        assert data["exception_type"] == "RuntimeError"
        assert data["message"] == f"{CUDA_OOM} [{tag}]"
        assert data["method"] == "Trainer.step" or data["method"].endswith(".step")
        assert data["actor_class"] == "RemoteOverCapture" and data["actor_id"]
        assert data["node_id"] in (ray_cluster.head_node_id, ray_cluster.worker_node_id)
        assert data["pid"] == record.pid and data["pid"] != __import__("os").getpid()
        step_locals = _frame(record, "step")["locals"]
        assert step_locals["api_token"] == REDACTED
        assert step_locals["step"] == "7" and step_locals["micro_batch"] == "[7, 7, 7, 7]"
        assert "hf_xxxx" not in json.dumps(data)  # the secret is nowhere in the capsule
        assert data["explanations"][0]["id"] == "cuda-oom"
        assert "GPU" in data["cause"] and data["fix"]
        assert data["memory"]["rss_bytes"] > 0
        assert data["environment"].get("RAYSLEUTH_HOME") == str(ray_cluster.home)
        assert 'raise RuntimeError(f"{CUDA_OOM} [{tag}]")' in data["traceback"]
        # The actor survives an exception in a method, as Ray keeps it: capture did not kill it.
        assert ray.get(actor.whoami.remote(), timeout=60) == 3
    finally:
        ray.kill(actor)


def test_capture_over_remote_sync_async_init_and_handled(ray_cluster):
    import ray

    from victims.crashing_actor import CaptureOverRemote

    tag = _tag()
    actor = CaptureOverRemote.remote(1)
    broken = CaptureOverRemote.remote(2, True)
    try:
        with pytest.raises(ValueError) as caught:
            ray.get(actor.bad_input.remote(tag), timeout=120)
        assert type(caught.value.cause) is ValueError
        record = _capsule(ray_cluster.home, tag)
        assert record.rank == 1 and record.data["exception_type"] == "ValueError"
        assert _frame(record, "bad_input")["locals"]["learning_rate"] == "0.0003"
        # No known infrastructure cause: the capsule blames the code, with file and line.
        assert "crashing_actor.py" in record.data["cause"] and record.data["explanations"] == []

        # An exception the actor itself catches is not a crash: no capsule.
        handled_tag = _tag()
        assert ray.get(actor.handled.remote(handled_tag), timeout=60) == "recovered"

        # The constructor: the actor dies in __init__, the capsule says so.
        with pytest.raises(ray.exceptions.ActorDiedError):
            ray.get(broken.whoami.remote(), timeout=120)
        init_record = _capsule(ray_cluster.home, "checkpoint for rank 2 not found")
        assert init_record.rank == 2 and init_record.data["method"].endswith("__init__")
        assert _frame(init_record, "__init__")["locals"]["secret_password"] == REDACTED

        from raysleuth.recorder import open_store

        store = open_store(home=ray_cluster.home)
        try:
            assert not [r for r in store.query("crash") if handled_tag in r.data.get("message", "")]
        finally:
            store.close()
    finally:
        ray.kill(actor)
        ray.kill(broken)


def test_async_method_and_remote_task(ray_cluster):
    import ray

    from victims.crashing_actor import RemoteOverCapture, crashing_task

    tag = _tag()
    actor = RemoteOverCapture.remote(0)
    try:
        with pytest.raises(KeyError) as caught:
            ray.get(actor.astep.remote(tag), timeout=120)
        assert type(caught.value.cause) is KeyError
        record = _capsule(ray_cluster.home, tag)
        assert record.rank == 0 and record.data["exception_type"] == "KeyError"
        assert _frame(record, "astep")["locals"]["api_token"] == REDACTED
    finally:
        ray.kill(actor)

    task_tag = _tag()
    with pytest.raises(ZeroDivisionError):
        ray.get(crashing_task.remote(task_tag), timeout=120)
    record = _capsule(ray_cluster.home, task_tag)
    assert record.data["exception_type"] == "ZeroDivisionError" and record.data["actor_id"] is None
    assert _frame(record, "crashing_task")["locals"]["api_token"] == REDACTED


def test_instrument_live_actor_through_ray_call(ray_cluster):
    import ray

    from victims.crashing_actor import Uninstrumented

    actor = Uninstrumented.remote(5)
    try:
        before = _tag()
        with pytest.raises(ValueError):
            ray.get(actor.bad_input.remote(before), timeout=120)
        ray.get(actor.__ray_call__.remote(lambda self: postmortem.install_crash_capture_on_instance(self) and None),
                timeout=60)
        after = _tag()
        with pytest.raises(ValueError) as caught:
            ray.get(actor.bad_input.remote(after), timeout=60)
        assert type(caught.value.cause) is ValueError
        record = _capsule(ray_cluster.home, after)
        assert record.rank == 5 and record.data["actor_class"] == "Uninstrumented"
        from raysleuth.recorder import open_store

        store = open_store(home=ray_cluster.home)
        try:  # before instrumenting, nothing was captured
            assert not [r for r in store.query("crash") if before in r.data.get("message", "")]
        finally:
            store.close()
    finally:
        ray.kill(actor)


def test_crashes_cli_lists_and_shows_after_the_fact(ray_cluster, capsys):
    import ray

    from raysleuth.cli import main
    from victims.crashing_actor import RemoteOverCapture

    tag = _tag()
    actor = RemoteOverCapture.remote(2)
    try:
        with pytest.raises(RuntimeError):
            ray.get(actor.step.remote(1, tag), timeout=120)
    finally:
        ray.kill(actor)
    record = _capsule(ray_cluster.home, tag)

    capsys.readouterr()
    assert main(["crashes", "--json", "--home", str(ray_cluster.home), "--rank", "2"]) == 1
    listed = json.loads(capsys.readouterr().out)
    mine = [item for item in listed if item["id"] == record.id]
    assert mine and mine[0]["rank"] == 2 and mine[0]["cause"] == "CUDA out of memory"
    assert all(item["rank"] == 2 for item in listed)

    assert main(["crashes", "show", str(record.id), "--json", "--home", str(ray_cluster.home)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == record.id and shown["data"]["frames"]

    # The installed command, in a fresh process that never joined the cluster.
    done = subprocess.run([str(REPO / ".venv/bin/raysleuth"), "crashes", "show", str(record.id), "--home",
                           str(ray_cluster.home)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "api_token = <redacted>" in done.stdout and "CUDA out of memory" in done.stdout
    done = subprocess.run([str(REPO / ".venv/bin/raysleuth"), "crashes", "--home", str(ray_cluster.home)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and str(record.id) in done.stdout
    assert main(["crashes", "show", "999999", "--home", str(ray_cluster.home)]) == 2


# ------------------------------------------------------------- no Ray


def test_redact_names_and_values():
    assert redact("api_token", "abc") == REDACTED
    assert redact("HF_TOKEN", "anything") == REDACTED
    assert redact("db_password", 1234) == REDACTED
    assert redact("AWS_SECRET_ACCESS_KEY", "x") == REDACTED
    assert redact("Authorization", "x") == REDACTED
    assert redact("note", "hf_" + "a" * 30) == REDACTED
    assert redact("note", "sk-" + "abc123" * 5) == REDACTED
    assert redact("note", "0123456789abcdef" * 3) == REDACTED
    assert redact("digest", "0123456789abcdef" * 3) == "0123456789abcdef" * 3  # named as an identifier: kept
    assert redact("header", "Bearer abc.def.ghi123456") != "Bearer abc.def.ghi123456"
    assert redact("learning_rate", 3e-4) == 3e-4
    assert redact("model_name", "Qwen2.5-7B-Instruct") == "Qwen2.5-7B-Instruct"
    assert redact("path", "/data/checkpoints/step_100") == "/data/checkpoints/step_100"
    assert redact("PWD", "/home/me") == "/home/me"
    text = redact_text("{'api_key': 'abc123', 'lr': 0.1} curl -H 'Authorization: Bearer eyJabc' hf_" + "q" * 25)
    assert "abc123" not in text and "hf_qqq" not in text and "'lr': 0.1" in text


def test_relevant_environment_is_filtered_and_redacted():
    env = {"RANK": "3", "WORLD_SIZE": "8", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO",
           "MASTER_ADDR": "10.0.0.1", "HF_TOKEN": "hf_" + "z" * 30, "RAY_AUTH_TOKEN": "t0k3n",
           "HOME": "/root", "SHELL": "/bin/bash", "RAYSLEUTH_DEBUG": "1"}
    kept = postmortem.relevant_environment(env)
    assert kept["RANK"] == "3" and kept["NCCL_DEBUG"] == "INFO" and kept["MASTER_ADDR"] == "10.0.0.1"
    assert kept["HF_TOKEN"] == REDACTED and kept["RAY_AUTH_TOKEN"] == REDACTED
    assert "HOME" not in kept and "SHELL" not in kept


def test_capture_into_a_local_store_keeps_chain_and_object(tmp_path):
    """The capsule goes through a real client into a real local SQLite run; the same object is re-raised."""
    from raysleuth.recorder import RecordClient, StoreSink, open_store, reset_client
    from raysleuth.recorder.store import open_run

    old = reset_client(RecordClient(StoreSink(open_run(tmp_path, "local")), spool_dir=tmp_path / "spool"))
    try:
        original = None

        @postmortem.capture_crashes
        def load(path):
            password = "hunter2"  # noqa: F841
            try:
                open(path)
            except FileNotFoundError as error:
                nonlocal original
                original = KeyError("config")
                raise original from error

        with pytest.raises(KeyError) as caught:
            load(str(tmp_path / "missing.yaml"))
        assert caught.value is original  # the very same object, same type
        from raysleuth.recorder import get_client

        get_client().flush(10)
        record = open_store(home=tmp_path).query("crash")[-1]
        chain = record.data["chain"]
        assert [link["type"] for link in chain] == ["KeyError", "FileNotFoundError"]
        assert chain[1]["relation"] == "cause"
        assert _frame(record, "load")["locals"]["password"] == REDACTED
    finally:
        client = reset_client(old)
        if client is not None:
            client.close()


def test_capture_failure_never_masks_the_exception(monkeypatch):
    from raysleuth.postmortem import capsule

    tried = []

    def broken_build(exc, *, method=None):
        tried.append(exc)
        raise OSError("disk on fire")

    monkeypatch.setattr(capsule, "build_capsule", broken_build)  # where capture_exception looks it up

    @postmortem.capture_crashes
    def step():
        raise ArithmeticError("the user's own error")

    with pytest.raises(ArithmeticError, match="the user's own error"):
        step()
    assert len(tried) == 1 and isinstance(tried[0], ArithmeticError)  # the failing capture path really ran


def test_install_crash_capture_is_idempotent_and_chains_hooks():
    """In a fresh interpreter: the hooks install once, keep the previous hooks, capture thread crashes."""
    script = r"""
import sys, threading, json, os
import raysleuth as rs
from raysleuth import postmortem
seen = []
threading.excepthook = lambda args: seen.append(type(args.exc_value).__name__)
assert rs.install_crash_capture() is True
first = (sys.excepthook, threading.excepthook)
assert rs.install_crash_capture() is False
assert (sys.excepthook, threading.excepthook) == first
t = threading.Thread(target=lambda: 1 / 0, name="loader"); t.start(); t.join()
from raysleuth.recorder import get_client, open_store
get_client().flush(10)
rec = open_store(home=os.environ["RAYSLEUTH_HOME"]).query("crash")[-1]
print(json.dumps({"seen": seen, "method": rec.data["method"], "type": rec.data["exception_type"]}))
"""
    import tempfile

    with tempfile.TemporaryDirectory() as home:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                              env={"RAYSLEUTH_HOME": home, "PATH": "/usr/bin:/bin",
                                   "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"seen": ["ZeroDivisionError"], "method": "thread:loader", "type": "ZeroDivisionError"}


def test_post_mortem_opens_a_bounded_session_then_reraises(tmp_path):
    """RAYSLEUTH_POST_MORTEM: a real debug session opens at the crash, nobody attaches, the wait limit lets go."""
    from raysleuth import runtime
    from raysleuth.recorder import RecordClient, StoreSink, get_client, open_store, reset_client
    from raysleuth.recorder.store import open_run

    old_settings = runtime.settings()
    runtime.reload_settings(post_mortem=True, debug_wait=1.0, debugger="pdb")
    old = reset_client(RecordClient(StoreSink(open_run(tmp_path, "local")), spool_dir=tmp_path / "spool"))
    try:
        @postmortem.capture_crashes
        def evaluate():
            reward = -1.0  # noqa: F841
            raise LookupError("no reward model for this prompt")

        started = time.monotonic()
        with pytest.raises(LookupError, match="no reward model"):
            evaluate()
        assert time.monotonic() - started < 60
        get_client().flush(10)
        kinds = open_store(home=tmp_path).kinds()
        assert kinds.get("crash") == 1
        assert kinds.get("debug_session", 0) >= 1  # the breakpoints feature registered the session
    finally:
        client = reset_client(old)
        if client is not None:
            client.close()
        runtime.reload_settings(post_mortem=old_settings.post_mortem, debug_wait=old_settings.debug_wait,
                                debugger=old_settings.debugger)
