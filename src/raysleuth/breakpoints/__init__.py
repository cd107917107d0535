"""Breakpoints that hit inside Ray workers, and never hang a job forever.

    import raysleuth as rs
    rs.breakpoint_on_rank(1)                       # only rank 1 stops
    rs.conditional_breakpoint(condition=loss > 10, rank_filter=lambda r: r == 0)
    rs.breakpoint(name="after-rollout", rank=[0, 3], when=step % 100 == 0)

**Off unless armed.** A disarmed call is one read of a module-level bool
(``arming._quiet``), measured by ``bench/bench_breakpoint.py``. Breakpoints are
armed by ``RAYSLEUTH_DEBUG=1`` (alias ``VERL_DEBUG``) or at runtime from
outside: ``raysleuth debug arm [NAME] [--rank R]`` sets the writer control
``debug``; a daemon thread started on the first call polls the controls
every :data:`POLL_INTERVAL` seconds, so running workers pick it up without
a restart (``debug disarm`` turns them off again, env-armed ones included).

**When hit** (armed, rank and condition pass): a debug server starts on
``settings().debug_host`` (127.0.0.1 by default) — debugpy, or pdb over TCP
with ``RAYSLEUTH_DEBUGGER=pdb`` — the session is published (evidence kind
``debug_session`` plus the writer mailbox ``debug_sessions``), and the
worker waits for a client at most ``settings().debug_wait`` seconds
(``RAYSLEUTH_DEBUG_WAIT``, default 600). An unattended breakpoint logs a
warning and lets the worker run on; that location then stays quiet until
breakpoints are armed again, so a breakpoint in a loop cannot stall a job
600 s per step. Other ranks never wait. ``debug disarm`` also releases
breakpoints that are waiting for a client (post-mortem sessions stay).

**Who may attach.** A pdb session has a per-session secret in a 0600 file
(``$RAYSLEUTH_HOME/debug/<session>.secret`` on the worker's node); a client
must send it as its first line (``raysleuth debug attach`` does), else it
is disconnected without a prompt. debugpy has no authentication: it
listens on 127.0.0.1 only, and ``debug ls`` says so.

Scaling note: each process polls the writer once per POLL_INTERVAL (one
tiny actor call). At thousands of workers, publish the control through a
per-node agent (one poll per node) instead.
"""

from __future__ import annotations

from raysleuth.breakpoints._sessions import (
    DEBUGPY_NOTE,
    DebugSession,
    attach_instructions,
    local_addresses,
    merge_launch_json,
    vscode_configuration,
    write_launch_json,
)
from raysleuth.breakpoints.arming import (
    POLL_INTERVAL,
    ArmState,
    arm,
    arm_cluster,
    arm_state,
    breakpoint,
    breakpoint_on_rank,
    conditional_breakpoint,
    disarm,
    disarm_cluster,
    reset_cluster,
)
from raysleuth.breakpoints.listing import find_session, list_sessions
from raysleuth.breakpoints.opening import post_mortem_session

__all__ = [
    "ArmState",
    "DEBUGPY_NOTE",
    "DebugSession",
    "POLL_INTERVAL",
    "arm",
    "arm_cluster",
    "arm_state",
    "attach_instructions",
    "breakpoint",
    "breakpoint_on_rank",
    "conditional_breakpoint",
    "disarm",
    "disarm_cluster",
    "find_session",
    "list_sessions",
    "local_addresses",
    "merge_launch_json",
    "post_mortem_session",
    "reset_cluster",
    "vscode_configuration",
    "write_launch_json",
]
