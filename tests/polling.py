"""Waiting for a real cluster to show something: the one polling helper of the tests."""

from __future__ import annotations

import time
from typing import Any, Callable


def poll(read: Callable[[], Any], until: Callable[[Any], Any] = bool, *, timeout: float = 60.0,
         interval: float = 0.5) -> Any:
    """Call ``read`` until ``until(value)`` holds or ``timeout`` passes; return the last value read."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if until(value) or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
