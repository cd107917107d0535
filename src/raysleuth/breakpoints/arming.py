"""Arming, and the calls that stop only when armed (``breakpoint``, ``breakpoint_on_rank``...).

The hot path reads only :data:`_quiet`, a module-level bool of this module.
Arming comes from ``RAYSLEUTH_DEBUG`` or, at runtime, from the writer's
``debug`` control (``raysleuth debug arm``), polled by the worker's control
thread; a hit that passes every filter opens a session
(:mod:`raysleuth.breakpoints.opening`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from raysleuth import runtime
from raysleuth.breakpoints._sessions import CONTROL_KEY
from raysleuth.breakpoints.opening import _open_session, _warn_once
from raysleuth.errors import CaptureTimeout

__all__ = [
    "ArmState",
    "POLL_INTERVAL",
    "apply_control",
    "arm",
    "arm_cluster",
    "arm_state",
    "breakpoint",
    "breakpoint_on_rank",
    "conditional_breakpoint",
    "disarm",
    "disarm_cluster",
    "reset_cluster",
]

#: Seconds between two polls of the writer's controls (runtime arming).
POLL_INTERVAL = 2.0

# The hot path reads only ``_quiet``: True when disarmed and the arming poll
# is already running. Everything else lives on the slow path.
_quiet = False
_armed = False
_arm_names: frozenset[str] | None = None
_arm_ranks: frozenset[int] | None = None
_arm_epoch: Any = None
_initialised_pid: int | None = None
_poller: threading.Thread | None = None
_state_lock = threading.RLock()
_skipped: set[tuple[str, int, str | None]] = set()


class ArmState:
    """Whether breakpoints are armed in this process, and for what."""

    def __init__(self, armed: bool, names: frozenset[str] | None, ranks: frozenset[int] | None, source: str) -> None:
        self.armed = armed
        self.names = sorted(names) if names is not None else None
        self.ranks = sorted(ranks) if ranks is not None else None
        self.source = source

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"armed": self.armed, "names": self.names, "ranks": self.ranks, "source": self.source}


_arm_source = "env"


def _set(armed: bool, names: Iterable[str] | None, ranks: Iterable[int] | None, source: str, epoch: Any = None) -> None:
    global _armed, _arm_names, _arm_ranks, _quiet, _arm_epoch, _arm_source
    with _state_lock:
        if armed and (not _armed or epoch != _arm_epoch):
            _skipped.clear()  # armed again: unattended locations may stop again
        _armed = bool(armed)
        _arm_names = frozenset(names) if names else None
        _arm_ranks = frozenset(int(r) for r in ranks) if ranks is not None and ranks != [] else None
        _arm_epoch = epoch
        _arm_source = source
        _quiet = (not _armed) and _poller is not None


def _initialise() -> None:
    """First call in this process: read the settings and follow the writer's ``debug`` control.

    Arming is polled by the worker's one control thread (:mod:`raysleuth.control`).
    """
    global _initialised_pid, _poller, _quiet
    with _state_lock:
        if _initialised_pid == os.getpid():
            return
        _initialised_pid = os.getpid()
        _set(runtime.settings().debug, None, None, "env")
        from raysleuth import control  # lazy: rs.breakpoint stays light to import: this loads when a session opens

        control.register(CONTROL_KEY, apply_control)
        _poller = control.thread()
        _quiet = not _armed


def apply_control(value: Any) -> None:
    """Apply the writer's ``debug`` control (``None``: back to the environment's setting)."""
    if not isinstance(value, dict):
        _set(runtime.settings().debug, None, None, "env")
        return
    _set(bool(value.get("armed")), value.get("names"), value.get("ranks"), "control", value.get("since"))


def arm(name: str | Iterable[str] | None = None, ranks: int | Iterable[int] | None = None) -> None:
    """Arm breakpoints in this process (only ``name``d ones / on ``ranks`` when given)."""
    _initialise()
    names = [name] if isinstance(name, str) else (list(name) if name else None)
    rank_list = [ranks] if isinstance(ranks, int) else (list(ranks) if ranks is not None else None)
    _set(True, names, rank_list, "arm()", time.time())


def disarm() -> None:
    """Disarm breakpoints in this process (until armed again, locally or by the CLI)."""
    _initialise()
    _set(False, None, None, "disarm()")


def arm_state() -> ArmState:
    """This process's arming, and where it came from (env, control, arm())."""
    _initialise()
    return ArmState(_armed, _arm_names, _arm_ranks, _arm_source)


def _set_control(value: Any, timeout: float) -> None:
    """Post the arming ``value`` to the writer; a writer that does not answer is a clear error, not a traceback."""
    # lazy: rs.breakpoint stays light to import: this loads when a session opens
    from raysleuth.recorder import get_writer
    import ray

    try:
        ray.get(get_writer().set_control.remote(CONTROL_KEY, value), timeout=timeout)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as error:
        raise CaptureTimeout(f"the evidence writer did not take the breakpoint arming within {timeout:g}s "
                             f"({type(error).__name__})",
                             fix="check `raysleuth doctor`; retry when the writer answers") from None


def arm_cluster(name: str | None = None, ranks: Iterable[int] | None = None, *,
                timeout: float = 30.0) -> dict[str, Any]:
    """Arm breakpoints in every worker of the connected cluster (picked up within POLL_INTERVAL s)."""
    value = {"armed": True, "names": [name] if name else None,
             "ranks": sorted(int(r) for r in ranks) if ranks else None, "since": time.time()}
    _set_control(value, timeout)
    return value


def disarm_cluster(*, timeout: float = 30.0) -> dict[str, Any]:
    """Disarm breakpoints in every worker, including workers armed by RAYSLEUTH_DEBUG=1."""
    value = {"armed": False, "since": time.time()}
    _set_control(value, timeout)
    return value


def reset_cluster(*, timeout: float = 30.0) -> None:
    """Forget runtime arming: every worker follows its own RAYSLEUTH_DEBUG again."""
    _set_control(None, timeout)


def breakpoint(name: str | None = None, rank: int | Iterable[int] | None = None,
               when: bool | Callable[[], bool] = True) -> None:
    """Stop here in a debugger, if breakpoints are armed, the rank matches and ``when`` holds.

    ``rank``: a rank or ranks that stop (``None``: every rank). ``when``: a
    bool or a callable evaluated only when armed. Disarmed, this costs one
    bool check. Never raises; other ranks run on; waits at most
    ``RAYSLEUTH_DEBUG_WAIT`` seconds for a client.
    """
    if _quiet:
        return None
    _consider(sys._getframe(1), name, rank, when)
    return None


def breakpoint_on_rank(rank: int | Iterable[int], name: str | None = None) -> None:
    """A breakpoint that only ``rank`` (or ranks) stop at; the others run on."""
    if _quiet:
        return None
    _consider(sys._getframe(1), name, rank, True)
    return None


def conditional_breakpoint(condition: bool | Callable[[], bool] = True,
                           rank_filter: int | Iterable[int] | Callable[[int | None], bool] | None = None,
                           name: str | None = None) -> None:
    """Stop where ``condition`` holds and the rank passes ``rank_filter`` (a callable, rank or ranks)."""
    if _quiet:
        return None
    _consider(sys._getframe(1), name, rank_filter, condition)
    return None


def _rank_matches(rank: int | None, wanted: Any) -> bool:
    if wanted is None:
        return True
    if callable(wanted):
        return bool(wanted(rank))
    if rank is None:
        return False
    if isinstance(wanted, int):
        return rank == wanted
    return rank in set(wanted)


def _consider(frame: FrameType, name: str | None, rank_filter: Any, when: Any) -> None:
    """The slow path: arming, filters, condition, then a session. Never raises."""
    try:
        if _initialised_pid != os.getpid():
            _initialise()
        if not _armed:
            return
        if _arm_names is not None and name not in _arm_names:
            return
        rank = runtime.get_rank()
        if _arm_ranks is not None and rank not in _arm_ranks:
            return
        if not _rank_matches(rank, rank_filter):
            return
        if callable(when):
            when = when()
        if not when:
            return
        key = (frame.f_code.co_filename, frame.f_lineno, name)
        if key in _skipped:
            return
    except Exception as error:  # a bad condition or filter must not take the step down
        _warn_once(f"condition:{error!r}", "raysleuth: breakpoint %s skipped: %r", name, error)
        return
    _open_session(frame, name, key=key, skipped=_skipped, cancelled=_disarmed)


def _disarmed() -> bool:
    """Breakpoints were disarmed on purpose (``raysleuth debug disarm``, ``rs.disarm()``): a waiting one lets go.

    Falling back to the environment (the first poll of an unset control, ``debug disarm --reset``) releases none.
    """
    return not _armed and _arm_source != "env"
