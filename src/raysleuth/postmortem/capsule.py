"""Building a crash capsule from an exception, and writing it to the evidence store."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

from raysleuth import runtime
from raysleuth.redaction import _redacted_repr, redact_text, relevant_environment

log = logging.getLogger("raysleuth.postmortem")

# ---------------------------------------------------------------- memory


def _memory() -> dict[str, Any]:
    result: dict[str, Any] = {}
    try:
        import psutil

        process = psutil.Process()
        info = process.memory_info()
        result["rss_bytes"] = info.rss
        result["vms_bytes"] = info.vms
        try:
            result["uss_bytes"] = process.memory_full_info().uss
        except Exception:
            pass
        virtual = psutil.virtual_memory()
        result["node_total_bytes"] = virtual.total
        result["node_available_bytes"] = virtual.available
        result["node_percent"] = virtual.percent
    except Exception as error:
        result["error"] = repr(error)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                device = torch.cuda.current_device()
                result["cuda"] = {
                    "device": device,
                    "allocated_bytes": torch.cuda.memory_allocated(device),
                    "reserved_bytes": torch.cuda.memory_reserved(device),
                    "max_allocated_bytes": torch.cuda.max_memory_allocated(device),
                }
        except Exception as error:
            result["cuda_error"] = repr(error)
    return result


# --------------------------------------------------------------- capsule


@dataclasses.dataclass(kw_only=True)
class CrashCapsule:
    """Everything a worker knew when an exception escaped it (serialises to JSON)."""

    time: float
    """When the exception was caught (epoch seconds)."""
    rank: int | None
    world_size: int | None
    node_id: str | None
    node_ip: str | None
    hostname: str
    pid: int
    actor_id: str | None
    actor_name: str | None
    actor_class: str | None
    method: str | None
    """The captured function or method (qualified name), or ``sys.excepthook`` / ``thread:<name>``."""
    exception_type: str
    """``module.QualName`` of the exception."""
    message: str
    """``str(exception)``, redacted and cut at 4000 characters."""
    chain: list[dict[str, Any]]
    """The exception and its ``__cause__``/``__context__`` chain, outermost first: type, message, relation."""
    traceback: str
    """The formatted traceback (with the chain), redacted."""
    frames: list[dict[str, Any]]
    """Innermost-last frames: file, line, function, code, locals (name -> redacted, truncated repr)."""
    memory: dict[str, Any]
    """psutil rss/uss (and node memory); ``cuda`` when CUDA is initialised."""
    environment: dict[str, str]
    """Relevant environment variables (rank, CUDA, RAY_*, NCCL_*, MASTER_*...), redacted."""
    step: int | None = None
    phase: str | None = None
    cause: str | None = None
    """The likely root cause from :func:`raysleuth.explain.explain`, if it knew one."""
    fix: str | None = None
    explanations: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Every knowledge-base match, root cause first (id, title, cause, fix, evidence)."""
    errors: list[str] = dataclasses.field(default_factory=list)
    """Parts of the capture that failed, and why (the capsule is still written)."""
    skipped_before: int = 0
    """Capsules this process skipped since the one before (over :data:`MAX_CAPSULES` per window)."""

    def to_dict(self) -> dict[str, Any]:
        """The capsule as a JSON-ready dict."""
        return dataclasses.asdict(self)


_MAX_FRAMES = 40
_MAX_LOCALS = 60
_MAX_CHAIN = 8
#: Frames of this package (the capture wrappers) are left out of capsules.
_OWN_DIR = os.path.normcase(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _own(filename: str) -> bool:
    return os.path.normcase(os.path.abspath(filename)).startswith(_OWN_DIR)


def _type_name(exc: BaseException) -> str:
    kind = type(exc)
    module = kind.__module__
    return kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = "<str() failed>"
    text = redact_text(text)
    return text if len(text) <= 4000 else text[:3997] + "..."


def _chain(exc: BaseException) -> list[dict[str, Any]]:
    chain: list[dict[str, Any]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    relation = "raised"
    while current is not None and id(current) not in seen and len(chain) < _MAX_CHAIN:
        seen.add(id(current))
        chain.append({"type": _type_name(current), "message": _message(current), "relation": relation})
        if current.__cause__ is not None:
            current, relation = current.__cause__, "cause"
        elif current.__context__ is not None and not current.__suppress_context__:
            current, relation = current.__context__, "context"
        else:
            current = None
    return chain


def _frames(exc: BaseException, errors: list[str]) -> list[dict[str, Any]]:
    frames = []
    entries = []
    tb = exc.__traceback__
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    for tb in entries[-_MAX_FRAMES:]:
        frame = tb.tb_frame
        code = frame.f_code
        if _own(code.co_filename):
            continue  # our own wrapper frame
        try:
            import linecache

            source = linecache.getline(code.co_filename, tb.tb_lineno).strip()
        except Exception:
            source = ""
        local_reprs: dict[str, str] = {}
        try:
            items = list(frame.f_locals.items())
            for name, value in items[:_MAX_LOCALS]:
                local_reprs[str(name)] = _redacted_repr(str(name), value)
            if len(items) > _MAX_LOCALS:
                local_reprs["..."] = f"{len(items) - _MAX_LOCALS} more locals not shown"
        except Exception as error:
            errors.append(f"locals of {code.co_name}: {error!r}")
        frames.append({
            "file": code.co_filename,
            "line": tb.tb_lineno,
            "function": code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
            "code": redact_text(source),
            "locals": local_reprs,
        })
    return frames


def _explain(capsule_text: str, errors: list[str]) -> list[dict[str, Any]]:
    try:
        # lazy: rs.capture_crashes stays light to import: this loads when a crash is captured
        from raysleuth.explain import explain

        return [match.to_dict() for match in explain(capsule_text)]
    except Exception as error:
        errors.append(f"explain: {error!r}")
        return []


_OWN_CODE_FIX = ("Read the traceback and the locals of the innermost frames in this capsule; to inspect the frame "
                 "live, rerun with RAYSLEUTH_POST_MORTEM=1 and `raysleuth debug attach ID`.")


def _own_code_cause(exc: BaseException, frames: list[dict[str, Any]]) -> str:
    """The cause when the knowledge base knows none: the exception and where the code raised it."""
    where = frames[-1] if frames else None
    place = f" at {where['file']}:{where['line']} in {where['function']}" if where else ""
    return (f"{_type_name(exc)} raised{place}: not a known Ray/CUDA/NCCL failure, so most likely a bug or a bad "
            f"input in this code")


def build_capsule(exc: BaseException, *, method: str | None = None) -> CrashCapsule:
    """Describe ``exc`` (with its traceback) as a :class:`CrashCapsule`. Never raises for a normal exception."""
    errors: list[str] = []
    try:
        me = runtime.whoami(refresh=True)  # a crash right after init_process_group has its rank
    except Exception as error:  # pragma: no cover - whoami catches its own failures
        errors.append(f"whoami: {error!r}")
        me = runtime.Identity(rank=None, world_size=None, local_rank=None, rank_source="none",
                              pid=os.getpid(), hostname="")
    try:
        described = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        described.stack = traceback.StackSummary.from_list(  # drop our own wrapper frames
            [frame for frame in described.stack
             if not _own(frame.filename)])
        formatted = "".join(described.format())
    except Exception as error:
        errors.append(f"format traceback: {error!r}")
        formatted = f"{_type_name(exc)}: {_message(exc)}"
    formatted = redact_text(formatted)
    if len(formatted) > 60_000:
        formatted = formatted[:20_000] + "\n...\n" + formatted[-40_000:]
    chain = _chain(exc)
    explanations = _explain(formatted, errors)
    frames = _frames(exc, errors)
    return CrashCapsule(
        time=time.time(),
        rank=me.rank,
        world_size=me.world_size,
        node_id=me.node_id,
        node_ip=me.node_ip,
        hostname=me.hostname,
        pid=me.pid,
        actor_id=me.actor_id,
        actor_name=me.actor_name,
        actor_class=me.actor_class,
        method=method,
        exception_type=_type_name(exc),
        message=_message(exc),
        chain=chain,
        traceback=formatted,
        frames=frames,
        memory=_memory(),
        environment=relevant_environment(),
        step=runtime.current_step(),
        phase=runtime.current_phase(),
        cause=explanations[0]["cause"] if explanations else _own_code_cause(exc, frames),
        fix=explanations[0]["fix"] if explanations else _OWN_CODE_FIX,
        explanations=explanations,
        errors=errors,
    )


# Identities of exceptions captured lately (a wrapped call, then sys.excepthook, see the same one).
_recent: deque = deque(maxlen=64)
_recent_lock = threading.Lock()

#: Not crashes: a cancelled request (asyncio), an exit, an interrupt. They leave no capsule.
SKIPPED_TYPES = (asyncio.CancelledError, SystemExit, KeyboardInterrupt, GeneratorExit)
#: At most this many capsules per process in any :data:`CAPSULE_WINDOW_S` seconds; the rest are counted.
MAX_CAPSULES = 20
CAPSULE_WINDOW_S = 60.0
_written: deque = deque()
_skipped = {"since_last": 0, "total": 0, "noted": False}


def _already_captured(exc: BaseException) -> bool:
    """True when this exception object was captured already.

    The object is marked (an attribute); ids alone are reused once an
    exception is freed, and a new crash then looked captured already. An
    exception that takes no attribute falls back to its recent ids.
    """
    try:
        if getattr(exc, "__raysleuth_captured__", False):
            return True
        exc.__raysleuth_captured__ = True  # type: ignore[attr-defined]
        return False
    except Exception:
        pass
    key = (id(exc), id(exc.__traceback__), type(exc))
    with _recent_lock:
        if key in _recent:
            return True
        _recent.append(key)
        return False


def _admit() -> tuple[bool, int, bool]:
    """Rate limit: (write this capsule?, capsules skipped since the last one written, first skip of a burst?)."""
    now = time.monotonic()
    with _recent_lock:
        while _written and now - _written[0] > CAPSULE_WINDOW_S:
            _written.popleft()
        if len(_written) >= MAX_CAPSULES:
            _skipped["since_last"] += 1
            _skipped["total"] += 1
            first, _skipped["noted"] = not _skipped["noted"], True
            return False, _skipped["since_last"], first
        _written.append(now)
        skipped, _skipped["since_last"], _skipped["noted"] = _skipped["since_last"], 0, False
        return True, skipped, False


def capsules_skipped() -> int:
    """Capsules this process skipped so far (rate limit)."""
    return _skipped["total"]


def capture_exception(exc: BaseException, *, method: str | None = None, flush_timeout: float | None = None,
                      post_mortem: bool | None = None) -> CrashCapsule | None:
    """Write a crash capsule for ``exc`` now. Never raises, never waits for the writer; returns the capsule or None.

    The capsule is on disk (the client's write-ahead file) before this
    returns; the client's background thread delivers it. ``flush_timeout``:
    also wait that long for the delivery (never from an event loop's thread).
    The same exception object is captured once, however many wrapped calls
    it passes through on its way out; a cancelled request
    (``asyncio.CancelledError``) is not a crash; past :data:`MAX_CAPSULES`
    in :data:`CAPSULE_WINDOW_S` seconds, capsules are skipped and counted
    (an ``event`` named ``capsules_skipped`` at the first, then
    ``skipped_before`` in the next capsule written).
    """
    try:
        if isinstance(exc, SKIPPED_TYPES) or runtime.settings().mode == "off" or _already_captured(exc):
            return None
        # lazy: rs.capture_crashes stays light to import: this loads when a crash is captured
        from raysleuth.recorder import get_client, record

        admitted, skipped, first = _admit()
        if not admitted:
            if first:
                record("event", {"reason": "rate limit", "max_capsules": MAX_CAPSULES, "window_s": CAPSULE_WINDOW_S,
                                 "exception_type": _type_name(exc), "method": method},
                       name="capsules_skipped", level="WARNING")
            return None
        capsule = build_capsule(exc, method=method)
        capsule.skipped_before = skipped
        label = ".".join(part for part in (capsule.actor_class, (method or "").rsplit(".", 1)[-1]) if part)
        record("crash", capsule.to_dict(), name=label or method or capsule.exception_type, level="ERROR")
        client = get_client()
        if flush_timeout and not _in_event_loop():
            client.flush(timeout=flush_timeout)
        else:
            client.nudge()  # the background thread delivers it now; this thread goes on at once
    except Exception as error:
        log.warning("raysleuth: crash capture failed (%r); the exception is re-raised unchanged", error)
        capsule = None
    if post_mortem if post_mortem is not None else _post_mortem_enabled():
        _open_post_mortem(exc, method)
    return capsule


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def _post_mortem_enabled() -> bool:
    try:
        return bool(runtime.settings().post_mortem)
    except Exception:
        return False


def _open_post_mortem(exc: BaseException, method: str | None) -> None:
    try:
        # lazy: rs.capture_crashes stays light to import: this loads when a crash is captured
        from raysleuth.breakpoints import post_mortem_session  # built by the breakpoints feature

        post_mortem_session(exc, name=f"post-mortem:{method or _type_name(exc)}")  # exception + its traceback
    except BaseException as error:  # a debugger session must never change the crash
        log.warning("raysleuth: post-mortem session not opened (%r)", error)
