"""Spans, @trace, events and detailed Ray-call tracing, written to a real SQLite store."""

from __future__ import annotations

import asyncio
import time

import pytest

import raysleuth as rs
from raysleuth import runtime
from raysleuth.recorder import RecordClient, StoreSink, reset_client
from raysleuth.recorder.store import EvidenceStore


@pytest.fixture
def store(tmp_path):
    """A real store behind this process's client (restored afterwards)."""
    database = EvidenceStore(tmp_path / "evidence.sqlite")
    client = RecordClient(StoreSink(database), spool_dir=tmp_path / "spool")
    old = reset_client(client)
    try:
        yield database, client
    finally:
        client.close()
        reset_client(old)


def test_spans_nest_set_phase_and_record(store):
    database, client = store
    runtime.set_step(3)
    with rs.span("rollout", batch=8) as outer:
        assert runtime.current_phase() == "rollout"
        with rs.span("generate", step=4):
            assert runtime.current_phase() == "generate"
            time.sleep(0.01)
        assert runtime.current_phase() == "rollout"
    assert runtime.current_phase() is None
    with pytest.raises(KeyError):
        with rs.span("boom"):
            raise KeyError("x")
    assert client.flush(10)
    spans = {record.name: record for record in database.query("span")}
    assert spans["rollout"].step == 3 and spans["rollout"].data["attrs"] == {"batch": 8}
    assert spans["generate"].step == 4 and spans["generate"].data["parent_id"] == outer.span_id
    assert spans["generate"].data["duration_s"] >= 0.01
    assert spans["generate"].data["start"] >= spans["rollout"].data["start"]
    assert spans["generate"].data["end"] <= spans["rollout"].data["end"]
    assert spans["boom"].data["error"] == "KeyError"


def test_a_phase_set_inside_a_span_keeps_the_span_the_parent_and_records_carry_the_phase(store):
    """One context variable holds the innermost scope: a span, or a phase set inside one."""
    database, client = store
    with rs.span("train") as outer:
        token = runtime.set_phase("optimizer")
        assert runtime.current_phase() == "optimizer"
        with rs.span("clip") as inner:
            assert runtime.current_phase() == "clip"
            rs.event("clipped", norm=1.5)
        assert runtime.current_phase() == "optimizer"
        runtime._phase.reset(token)
        assert runtime.current_phase() == "train"
    assert runtime.current_phase() is None

    def steps():  # a span left open across yields, closed in another context
        with rs.span("gen"):
            yield 1
            yield 2

    generator = steps()
    next(generator)
    import contextvars

    contextvars.copy_context().run(lambda: list(generator))
    assert client.flush(10)
    spans = {record.name: record for record in database.query("span")}
    assert spans["clip"].data["parent_id"] == outer.span_id and inner.parent_id == outer.span_id
    assert spans["train"].data["parent_id"] is None
    assert "gen" in spans
    assert [record.phase for record in database.query("event")] == ["clip"]


def test_trace_decorator_functions_methods_async_and_events(store):
    database, client = store

    @rs.trace
    def plain(x):
        return x + 1

    class Model:
        @rs.trace(name="model.forward", layer="all")
        def forward(self, x):
            return x * 2

    @rs.trace
    async def fetch():
        await asyncio.sleep(0.001)
        return "ok"

    assert plain(1) == 2 and Model().forward(3) == 6 and asyncio.run(fetch()) == "ok"
    assert plain.__name__ == "plain"
    rs.event("checkpoint", path="/tmp/x")
    assert client.flush(10)
    names = {record.name for record in database.query("span")}
    assert {"test_trace_decorator_functions_methods_async_and_events.<locals>.plain", "model.forward",
            "test_trace_decorator_functions_methods_async_and_events.<locals>.fetch"} <= names
    forward = database.query("span", name="model.forward")[0]
    assert forward.data["attrs"] == {"layer": "all"}
    events = database.query("event", name="checkpoint")
    assert events and events[0].data == {"path": "/tmp/x"}


def test_mode_off_records_nothing(store):
    database, client = store
    runtime.reload_settings(mode="off")
    try:
        with rs.span("quiet"):
            pass
    finally:
        runtime.reload_settings()
    client.flush(10)
    assert database.query("span", name="quiet") == []


def test_spans_of_many_threads_arrive_whole_with_their_rank(store):
    """Spans wait on one deque as plain fields; the client's thread makes each row: none lost, none torn."""
    import threading

    database, client = store
    rs.set_rank(5, 8)

    def work(thread: int) -> None:
        for i in range(2000):
            with rs.span(f"t{thread}", step=i, i=i):
                pass

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert client.flush(30)
    spans = database.query("span")
    assert len(spans) == 8000 and client.stats.recorded >= 8000 and client.stats.dropped == 0
    for record in spans:
        assert record.rank == 5 and record.data["attrs"] == {"i": record.step}, record
    assert {len({r.step for r in spans if r.name == f"t{n}"}) for n in range(4)} == {2000}


def test_spans_past_the_deque_s_room_are_dropped_and_counted(store, monkeypatch):
    from raysleuth import tracing
    from raysleuth.recorder.spans import SPANS

    database, client = store
    with rs.span("first"):  # this client now drains the spans
        pass
    assert client.flush(10)
    monkeypatch.setattr(tracing, "_SPANS_MAX", 10 * tracing.SPAN_FIELDS)
    client._wake.clear()
    with client._deliver_lock:  # the thread cannot drain meanwhile
        for i in range(15):
            with rs.span("burst", step=i):
                pass
        assert len(SPANS) == 10 * tracing.SPAN_FIELDS
    assert client.flush(10)
    assert len(database.query("span", name="burst")) == 10 and client.stats.dropped == 5


def test_a_new_process_client_takes_the_spans_from_then_on(tmp_path, store):
    database, client = store
    with rs.span("before"):
        pass
    other_store = EvidenceStore(tmp_path / "other.sqlite")
    other = RecordClient(StoreSink(other_store), spool_dir=tmp_path / "spool2")
    client.flush(10)
    old = reset_client(other)
    try:
        with rs.span("after"):
            pass
        assert other.flush(10) and client.flush(10)
    finally:
        other.close()
        reset_client(old)
    assert [r.name for r in database.query("span")] == ["before"]
    assert [r.name for r in other_store.query("span")] == ["after"]


def test_spans_left_waiting_when_the_client_changes_reach_the_new_one(tmp_path, store):
    """Spans the old client had not taken when it was replaced go to the new one at once, not at the next
    batch's worth (a span asks for a drainer only when none or a batch's worth wait): none is lost."""
    database, client = store
    from raysleuth.recorder.spans import SPAN_FIELDS, SPANS

    client.flush(10)
    client.drains = False  # it stops taking spans before these: they wait in the deque, as at a handover
    for index in range(3):
        with rs.span(f"left-{index}"):
            pass
    assert len(SPANS) == 3 * SPAN_FIELDS
    other_store = EvidenceStore(tmp_path / "other.sqlite")
    other = RecordClient(StoreSink(other_store), spool_dir=tmp_path / "spool2")
    old = reset_client(other)
    try:
        with rs.span("after"):
            pass
        assert other.flush(10)
    finally:
        other.close()
        reset_client(old)
    assert sorted(r.name for r in other_store.query("span")) == ["after", "left-0", "left-1", "left-2"]
    assert not SPANS


def test_a_forked_child_does_not_send_its_parent_s_waiting_spans(store):
    import os

    from raysleuth.recorder.spans import SPANS

    database, client = store
    with rs.span("parent"):
        pass
    with client._deliver_lock:  # still waiting when the child is forked
        pid = os.fork()
        if pid == 0:  # the child: what waited is the parent's
            os._exit(0 if not SPANS else 3)
    assert os.waitpid(pid, 0)[1] == 0
    assert client.flush(10)
    assert [r.name for r in database.query("span")] == ["parent"]


def test_detailed_tracing_traces_ray_calls_and_restores(ray_cluster):
    import ray
    from ray.actor import ActorMethod
    from ray.remote_function import RemoteFunction

    from raysleuth.recorder import get_client, open_store
    from victims.task_forensics import Worker, downstream

    original_task, original_actor = RemoteFunction._remote, ActorMethod._remote
    actor = Worker.remote()
    try:
        with rs.enable_detailed_tracing(completion=True):
            assert RemoteFunction._remote is not original_task
            refs = [downstream.remote(i) for i in range(3)]
            call = actor.work.remote(0.05)
            assert ray.get(refs, timeout=60) == [1, 2, 3] and ray.get(call, timeout=60) == 0.05
        untraced = downstream.remote(10)
        ray.get(untraced, timeout=60)
        assert RemoteFunction._remote is original_task and ActorMethod._remote is original_actor
        wanted = {ref.task_id().hex() for ref in refs} | {call.task_id().hex()}
        deadline = time.monotonic() + 60
        seen: dict[str, object] = {}
        while time.monotonic() < deadline and not wanted <= set(seen):
            get_client().flush(10)
            spans = open_store(home=ray_cluster.home).query("span")
            seen = {s.data["attrs"].get("task_id"): s for s in spans if (s.name or "").startswith("ray.call:")}
            time.sleep(0.3)
        assert wanted <= set(seen), "every call inside the block should be traced"
        assert untraced.task_id().hex() not in seen
        actor_span = seen[call.task_id().hex()]
        assert actor_span.data["attrs"]["call"] == "actor_call" and "work" in actor_span.name
        assert actor_span.data["duration_s"] >= 0.05  # submission to result ready
    finally:
        ray.kill(actor)
