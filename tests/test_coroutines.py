"""Reading an event loop's pending tasks from another thread, without the loop's help (issue 23)."""

from __future__ import annotations

import asyncio
import threading
import time

from raysleuth import coroutines


def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    loop.run_forever()


async def generate(never: asyncio.Event) -> str:
    await asyncio.sleep(0)
    await never.wait()  # nobody sets it
    return "done"


async def busy() -> None:
    while True:
        await asyncio.sleep(0.01)  # a new future each time: it never waits long at one point


def test_pending_tasks_of_another_threads_loop_with_their_await_chain_and_how_long():
    loop, ready = asyncio.new_event_loop(), threading.Event()
    threading.Thread(target=_serve, args=(loop, ready), daemon=True).start()
    assert ready.wait(5)
    never = asyncio.Event()
    stuck = asyncio.run_coroutine_threadsafe(generate(never), loop)
    ticking = asyncio.run_coroutine_threadsafe(busy(), loop)
    try:
        time.sleep(0.2)
        first = {item["task"]: item for item in coroutines.track(now=1000.0)}
        time.sleep(0.2)
        later = coroutines.track(now=1030.0)
        waits = {item["awaits"]: item for item in later}
        item = waits["asyncio Event.wait"]
        assert [f["function"] for f in item["frames"]] == ["generate", "Event.wait"]
        assert item["frames"][0]["file"] == __file__
        assert item["waited_s"] == 30.0 and first[item["task"]]["waited_s"] == 0.0  # the same point since then
        sleeper = next(i for i in later if i["frames"] and i["frames"][0]["function"] == "busy")
        assert sleeper["waited_s"] < 30.0  # it moved on to new futures between the two looks
        assert later[0] is item  # the longest wait first
        snapshot = coroutines.snapshot()
        assert snapshot["count"] >= 2 and snapshot["tasks"][0]["awaits"] == "asyncio Event.wait"
    finally:
        for future in (stuck, ticking):
            future.cancel()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(t.get_loop() is loop for t in coroutines.pending_tasks()):
            time.sleep(0.05)
        loop.call_soon_threadsafe(loop.stop)
    assert not [t for t in coroutines.pending_tasks() if t.get_loop() is loop]  # finished tasks are not listed
