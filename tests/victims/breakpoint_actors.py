"""Victim: ranked actors that run into raysleuth breakpoints.

Each method has a local (``some_local``) that a debugger client reads back,
so tests prove they stopped in the right frame, and returns after the
breakpoint, so tests prove the worker ran on.
"""

from __future__ import annotations

import os

import raysleuth as rs


class BreakpointWorker:
    """A training worker with breakpoints in its step."""

    def __init__(self, rank: int) -> None:
        rs.set_rank(rank, 4)
        self.rank = rank

    def pid(self) -> int:
        return os.getpid()

    def step_on_rank(self, target: int) -> dict:
        some_local = 4242 + self.rank
        rs.breakpoint_on_rank(target)
        return {"rank": self.rank, "after": some_local + 1}

    def step_named(self, name: str) -> dict:
        some_local = 4242 + self.rank
        rs.breakpoint(name=name)
        return {"rank": self.rank, "after": some_local + 1}

    def step_conditional(self, loss: float) -> dict:
        some_local = loss
        rs.conditional_breakpoint(condition=lambda: loss > 10, rank_filter=lambda r: r == self.rank)
        return {"rank": self.rank, "after": some_local}

    def crash_then_post_mortem(self) -> dict:
        try:
            crash_local = "x" * 3
            raise ValueError(f"bad batch {crash_local}")
        except ValueError as error:
            session = rs.post_mortem_session(error)
        return {"rank": self.rank, "session": None if session is None else session.to_dict()}

    def arm_state(self) -> dict:
        from raysleuth import breakpoints

        return breakpoints.arm_state().to_dict()
