"""A node agent never hands a worker controls the writer had replaced seconds before.

The CI run of stop 41 caught it: a worker started right after ``debug disarm`` then ``reset`` was
disarmed while it waited at a breakpoint, because its node's agent, with a slow read of the writer
under way, served the controls it had read before the reset.
"""

from __future__ import annotations

import threading
import time

from raysleuth import control
from raysleuth.agents.controls import ControlRelay

DISARMED = {"debug": {"armed": False}}
RESET: dict = {}


class SlowWriterRelay(ControlRelay):
    """A relay whose writer answers when ``answer`` is set (the writer's own state is ``state``)."""

    def __init__(self) -> None:
        super().__init__(ttl=0.05, stale_limit=0.3)
        self.state: dict = dict(DISARMED)
        self.answer = threading.Event()
        self.answer.set()

    def _read(self, method: str, *args):
        assert method == "get_controls"
        seen = dict(self.state)
        self.answer.wait(30)
        self.reads += 1
        return seen


def test_while_a_slow_read_is_under_way_only_young_controls_are_served():
    relay = SlowWriterRelay()
    assert relay.get() == DISARMED and relay.reads == 1
    assert relay.get() == DISARMED and relay.reads == 1  # within the ttl: no second read
    relay.state = dict(RESET)  # `debug reset` reaches the writer
    time.sleep(0.06)
    relay.answer.clear()  # the writer is busy: the next read takes a while
    reader = threading.Thread(target=relay.get)
    reader.start()
    while not relay._lock.locked():
        time.sleep(0.001)
    # still young: served (no second read of a busy writer) ...
    assert relay.get() == DISARMED
    time.sleep(0.3)
    # ... too old: nothing, so the worker keeps its own state instead of the pre-reset one
    assert relay.get() is None
    assert relay.reads == 1  # no caller read the writer a second time
    relay.answer.set()
    reader.join(10)
    assert relay.reads == 2
    assert relay.get() == RESET


def test_a_read_slower_than_the_ttl_is_stale_from_its_start():
    relay = SlowWriterRelay()
    relay.answer.clear()
    threading.Timer(0.1, relay.answer.set).start()  # the read takes twice the ttl
    assert relay.get() == DISARMED
    relay.state = dict(RESET)
    assert relay.get() == RESET and relay.reads == 2  # what took 0.1 s to read was already past its ttl


def test_a_worker_keeps_its_controls_while_its_agent_has_nothing_fresh(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Agent:
        def __init__(self) -> None:
            self.answers = [{"test-relay": {"armed": True}}, None, {}]

        def get_controls(self):
            return self.answers.pop(0)

    agent = Agent.remote()
    applied: list = []
    seen: dict = {}
    here = threading.current_thread()

    def handler(value) -> None:  # this process's own control thread (other tests started it) calls it too
        if threading.current_thread() is here:
            applied.append(value)

    control._handlers["test-relay"] = handler  # the thread's own table, as control.register fills it
    try:
        assert control._poll(agent, seen) is agent
        assert control._poll(agent, seen) is agent  # None: nothing applied, the agent kept
        assert applied == [{"armed": True}]
        assert control._poll(agent, seen) is agent
        assert applied == [{"armed": True}, None]  # the key went away: the handler hears of it
    finally:
        control._handlers.pop("test-relay", None)
        ray.kill(agent)
