"""The worker's control thread: one poll of the writer's controls, many handlers.

A feature that must act inside a worker on request (arm breakpoints, dump
collectives, dump stacks) registers a handler for a control key; one daemon
thread per process polls the writer's ``get_controls`` and calls the handler
whenever that key's value changes. Handlers run on the control thread, so
they work while the training thread is blocked inside a collective. A
handler that raises is logged once and never stops the thread.

The same thread runs *tick* callbacks (:func:`on_tick`) before each poll, and
every ``TICK_INTERVAL`` between polls while any wait early on:
slow, background work of the zero-code setup (log shipping, the memory
sampler, noticing the rank once ``torch.distributed`` is up) runs there, off
the worker's start-up path. Without handlers the writer is not polled.

The zero-code setup (:func:`raysleuth.setup_worker`) starts it in every
worker; features call :func:`register` from their own ``install``.

Scaling: every worker polls once per ``POLL_INTERVAL``, but it polls its own
node's agent (:mod:`raysleuth.agents.controls`), which reads the writer at
most twice a second for the whole node; without an agent on the node it
polls the writer. ``bench/bench_ingest.py`` counts the writer's polls.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, Callable

POLL_INTERVAL = 1.0
TICK_INTERVAL = 0.2
FAST_TICKS_S = 30.0
"""In the thread's first ``FAST_TICKS_S`` seconds, waiting tick callbacks (a rank not known yet) run
every ``TICK_INTERVAL``: a job that fails within a second of starting still has its ranks noticed
before its workers are killed. Later they run once per poll."""

_log = logging.getLogger("raysleuth.control")
_handlers: dict[str, Callable[[Any], None]] = {}
_ticks: list[Callable[[], Any]] = []
_lock = threading.Lock()
_thread: threading.Thread | None = None
_thread_pid: int | None = None
_failed: set[str] = set()


def register(key: str, handler: Callable[[Any], None]) -> None:
    """Call ``handler(value)`` on the control thread whenever control ``key`` changes."""
    with _lock:
        _handlers[key] = handler
    start()


def on_tick(callback: Callable[[], Any]) -> None:
    """Call ``callback()`` on the control thread before each poll until it returns True.

    For short background work; a callback that raises is dropped (logged once).
    """
    with _lock:
        _ticks.append(callback)
    start()


def thread() -> threading.Thread | None:
    """This process's control thread when it is alive, else None."""
    current = _thread
    return current if current is not None and _thread_pid == os.getpid() and current.is_alive() else None


def start() -> None:
    """Start this process's control thread (idempotent, fork-safe)."""
    global _thread, _thread_pid
    with _lock:
        if _thread is not None and _thread_pid == os.getpid() and _thread.is_alive():
            return
        _thread_pid = os.getpid()
        _thread = threading.Thread(target=_poll_loop, name="raysleuth-control", daemon=True)
        _thread.start()


def _run_ticks() -> None:
    with _lock:
        ticks = list(_ticks)
    for callback in ticks:
        try:
            done = callback()
        except Exception:
            done = True
            _log.debug("raysleuth control tick %r failed", callback, exc_info=True)
        if done:
            with _lock:
                if callback in _ticks:
                    _ticks.remove(callback)


def _poll_loop() -> None:
    handle = None
    seen: dict[str, Any] = {}
    polled, born = float("-inf"), time.monotonic()
    while True:
        _run_ticks()
        if time.monotonic() - polled >= POLL_INTERVAL:
            polled = time.monotonic()
            handle = _poll(handle, seen)
        with _lock:
            pending = bool(_ticks) and time.monotonic() - born < FAST_TICKS_S
        # ticks waiting early on (a rank not known yet) run again soon; the writer is polled at its own pace
        time.sleep(TICK_INTERVAL if pending else POLL_INTERVAL)


def _poll(handle: Any, seen: dict[str, Any]) -> Any:
    """One read of the writer's controls: each handler whose key changed is called. Returns the writer handle."""
    try:
        with _lock:
            handlers = dict(_handlers)
        ray = sys.modules.get("ray")
        if handlers and ray is not None and ray.is_initialized():
            if handle is None:
                handle = _source(ray)
            controls = ray.get(handle.get_controls.remote(), timeout=10)
            if controls is None:  # the agent has nothing fresh yet (a slow read of the writer): keep what we have
                return handle
            for key, handler in handlers.items():
                value = controls.get(key)
                if key in seen and seen[key] == value:
                    continue
                seen[key] = value
                _dispatch(key, handler, value)
        return handle
    except Exception:
        return None  # no writer yet, or it moved: look it up again next time


def _source(ray: Any) -> Any:
    """Where this worker reads the controls: its node's agent (which reads the writer once for the node), else
    the writer itself (no agent on this node, or one from a raysleuth without the relay)."""
    # lazy: every instrument imports the control thread: the relay's and the writer's clients load when it polls
    from raysleuth.agents.controls import node_agent

    agent = node_agent(ray, "get_controls")
    if agent is not None:
        return agent
    # lazy: as above
    from raysleuth.recorder import get_writer

    return get_writer(create=False)


def _dispatch(key: str, handler: Callable[[Any], None], value: Any) -> None:
    try:
        handler(value)
    except Exception:
        if key not in _failed:
            _failed.add(key)
            _log.warning("raysleuth control handler for %r failed", key, exc_info=True)
