"""Crash capture never freezes the caller's event loop, skips cancelled requests, and is rate limited (issue 24)."""

from __future__ import annotations

import asyncio
import time

import pytest

from raysleuth import postmortem
from raysleuth.postmortem import capsule as capsule_module
from raysleuth.recorder import RecordClient, StoreSink, reset_client
from raysleuth.recorder.store import open_run


class SlowSink(StoreSink):
    """A real local store behind a writer that takes 2 s to answer (loaded, or far away)."""

    def deliver(self, header, rows):
        time.sleep(2.0)
        super().deliver(header, rows)


@pytest.fixture
def slow_client(tmp_path):
    store = open_run(tmp_path, "local")
    client = RecordClient(SlowSink(store), interval=0.05, spool_dir=tmp_path / "spool")
    old = reset_client(client)
    getattr(capsule_module, "_written", []).clear()
    try:
        yield client, store
    finally:
        reset_client(old)
        client.close(timeout=5)


@postmortem.capture_crashes
async def _handler(n: int) -> None:
    await asyncio.sleep(0)
    raise ValueError(f"request {n} failed")


@postmortem.capture_crashes
async def _waits_forever() -> None:
    await asyncio.sleep(3600)


def test_a_crash_in_an_async_actor_does_not_freeze_its_event_loop(slow_client):
    client, store = slow_client

    async def main() -> float:
        gaps = []

        async def ticker() -> None:
            last = time.monotonic()
            for _ in range(40):
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        for n in range(3):
            with pytest.raises(ValueError):
                await _handler(n)
        await tick
        return max(gaps)

    worst = asyncio.run(main())
    assert worst < 1.0, f"the event loop stood still {worst:.2f}s while a capsule was delivered"
    assert client.flush(timeout=30)
    assert sorted(r.data["message"] for r in store.query("crash")) == [f"request {n} failed" for n in range(3)]


def test_a_cancelled_request_leaves_no_capsule(slow_client):
    client, store = slow_client

    async def main() -> None:
        task = asyncio.create_task(_waits_forever())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert client.flush(timeout=30)
    assert store.query("crash") == []


def test_capsules_are_rate_limited_per_process_and_the_skipped_are_counted(slow_client, monkeypatch):
    client, store = slow_client
    monkeypatch.setattr(capsule_module, "MAX_CAPSULES", 5, raising=False)
    monkeypatch.setattr(capsule_module, "CAPSULE_WINDOW_S", 600.0, raising=False)
    before = capsule_module.capsules_skipped()

    @postmortem.capture_crashes
    def handler(n):
        raise RuntimeError(f"bad request {n}")

    started = time.monotonic()
    for n in range(50):
        with pytest.raises(RuntimeError):
            handler(n)
    assert time.monotonic() - started < 5.0
    assert capsule_module.capsules_skipped() - before == 45
    monkeypatch.setattr(capsule_module, "CAPSULE_WINDOW_S", 0.0, raising=False)  # the window moves on: the next crash is
    with pytest.raises(RuntimeError):  # captured, with the count of those skipped
        handler(50)
    assert client.flush(timeout=60)
    crashes = store.query("crash")
    assert len(crashes) == 6
    assert crashes[-1].data["skipped_before"] == 45 and crashes[-1].data["message"] == "bad request 50"
    notes = store.query("event", name="capsules_skipped")
    assert len(notes) == 1 and notes[0].level == "WARNING" and notes[0].data["max_capsules"] == 5
