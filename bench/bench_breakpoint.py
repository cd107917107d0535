"""Cost of a disarmed ``rs.breakpoint(...)`` call against an empty function call, in one run.

Target (DESIGN.md rule 1): under 0.5 µs more than an empty call. Prints
the per-call figures and their ratio.
"""

from __future__ import annotations

import os
import timeit

os.environ.pop("RAYSLEUTH_DEBUG", None)
os.environ.pop("VERL_DEBUG", None)

import raysleuth as rs  # noqa: E402
from raysleuth import breakpoints  # noqa: E402
from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)

TARGET_NS = 500.0
NUMBER = 1_000_000


def empty(name=None, rank=None, when=True):
    return None


def best(statement: str, namespace: dict) -> float:
    """Best of 5 runs, in ns per call."""
    return min(timeit.repeat(statement, globals=namespace, number=NUMBER, repeat=5)) / NUMBER * 1e9


def main() -> int:
    rs.breakpoint()  # first call: reads the settings, starts the arming poll; later calls are disarmed
    assert breakpoints.arming._quiet, "breakpoints should be disarmed in this benchmark"
    namespace = {"rs": rs, "empty": empty, "breakpoint_on_rank": rs.breakpoint_on_rank}
    baseline = best("empty(name='x', rank=1)", namespace)
    call = best("rs.breakpoint(name='x', rank=1)", namespace)
    on_rank = best("breakpoint_on_rank(1)", namespace)
    extra = call - baseline
    print(f"empty function call:            {baseline:7.1f} ns")
    print(f"disarmed rs.breakpoint(...):    {call:7.1f} ns  (ratio {call / baseline:.2f}x, +{extra:.1f} ns)")
    print(f"disarmed rs.breakpoint_on_rank: {on_rank:7.1f} ns  (ratio {on_rank / baseline:.2f}x)")
    target("disarmed breakpoint cost", extra < TARGET_NS, f"+{extra:.1f} ns over an empty call (< {TARGET_NS:.0f} ns)")
    return exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
