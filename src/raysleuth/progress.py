"""Progress in the workers: ``rs.heartbeat(step)`` and ``with rs.step(n):``.

In a worker::

    rs.heartbeat(step)            # a timestamp into the batching client
    with rs.step(n):              # sets the current step, heartbeats on entry
        ...

Both are instruments: cheap, never blocking, never raising. The stall
watchdog that reads the ``heartbeat`` records is :mod:`raysleuth.stall`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from raysleuth import runtime

__all__ = ["heartbeat", "step"]


def heartbeat(step: int | None = None) -> None:
    """Say "this rank is alive at ``step``" (cheap; never blocks or raises)."""
    try:
        if step is not None:
            runtime.set_step(step)
        else:
            step = runtime.current_step()
        # lazy: rs.heartbeat stays light to import; the recorder loads at the first beat
        from raysleuth.recorder import record

        record("heartbeat", {"step": step}, step=step)
    except Exception:
        pass


@contextlib.contextmanager
def step(n: int) -> Iterator[int]:
    """Run one training step: sets the current step (tags records) and heartbeats."""
    token = None
    try:
        token = runtime.set_step(n)
    except Exception:
        pass
    heartbeat(n)
    try:
        yield n
    finally:
        if token is not None:
            with contextlib.suppress(Exception):
                runtime._step.reset(token)  # the process-wide last step stays n
