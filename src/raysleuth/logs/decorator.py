"""``debug_decorator``: a function's (redacted, truncated) arguments, duration and memory delta.

Each call writes one log line and one ``span`` record; with
``RAYSLEUTH_MODE=off`` the call goes straight through.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from raysleuth import runtime
from raysleuth.logs.loggers import get_logger
from raysleuth.recorder import record
from raysleuth.redaction import REDACTED, redact_text, redact_value, redacted_repr
from raysleuth.tracing import Span

__all__ = ["capture_arguments", "debug_decorator"]

F = TypeVar("F", bound=Callable[..., Any])


def _describe(name: str, value: Any, limit: int) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(value, (str, bytes)):
        try:
            return f"<{type(value).__name__} shape={tuple(shape)} dtype={dtype}>"
        except Exception:
            pass
    try:
        if isinstance(value, str):  # the whole text, so the cut below says how long it was
            cleaned = redact_value(value[:100_000], name)
            text = REDACTED if cleaned == REDACTED else repr(cleaned)
        else:
            text = redacted_repr(name, value, max(limit, 300) * 4)
    except Exception as error:
        text = f"<unreprable {type(value).__name__}: {type(error).__name__}>"
    return text if len(text) <= limit else text[:limit] + f"...(+{len(text) - limit} chars)"


def _log_line(logger: logging.Logger | None, level: int, message: str, duration: float, qualname: str) -> None:
    """The decorator's log line, from the logger of *this* process; a failing handler never costs the span.

    The logger is looked up at call time: a class decorated in the driver and
    shipped to a Ray worker must log through the worker's rank logger (with
    its store handler), not a plain logger unpickled by name.
    """
    try:
        log = logger
        if log is None:
            if _debug_logger[0] != os.getpid():
                _debug_logger[:] = [os.getpid(), get_logger("raysleuth.debug")]
            log = _debug_logger[1]
        log.log(level, message, extra={"duration_s": duration, "function": qualname})
    except Exception:
        pass


_debug_logger: list[Any] = [None, None]  # (pid, this process's "raysleuth.debug" rank logger)


def capture_arguments(function: Callable, args: tuple, kwargs: dict, limit: int = 200) -> dict[str, str]:
    """Each argument of a call, by parameter name: redacted, then repr'd and truncated to ``limit``."""
    try:
        bound = inspect.signature(function).bind_partial(*args, **kwargs)
        items = list(bound.arguments.items())
    except (TypeError, ValueError):
        items = [(f"arg{i}", value) for i, value in enumerate(args)] + list(kwargs.items())
    result = {}
    for name, value in items:
        if name == "self":
            continue
        result[name] = _describe(name, value, limit)
    return result


def _memory_now() -> tuple[int | None, int | None]:
    rss = gpu = None
    try:
        import psutil

        rss = int(psutil.Process().memory_info().rss)
    except Exception:
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                gpu = int(torch.cuda.memory_allocated())
        except Exception:
            pass
    return rss, gpu


@dataclass(frozen=True)
class _Options:
    """What ``debug_decorator`` was asked to keep, and where it logs."""

    capture_args: bool
    log_execution_time: bool
    memory_monitoring: bool
    logger: logging.Logger | None
    level: int
    max_arg_chars: int


def debug_decorator(function: F | None = None, *, capture_args: bool = True, log_execution_time: bool = True,
                    memory_monitoring: bool = True, logger: logging.Logger | None = None,
                    level: int = logging.INFO, max_arg_chars: int = 200) -> Any:
    """Wrap a function: log its (redacted, truncated) arguments, duration and memory delta.

    Each call writes one log line (``logger``, default ``raysleuth.debug``) and
    one ``span`` record named for the function's qualified name, with
    ``attrs`` ``{"args", "memory_delta_bytes", "gpu_memory_delta_bytes"}``.
    A raised exception is logged at ERROR and re-raised unchanged. With
    ``RAYSLEUTH_MODE=off`` the call goes straight through. Use as
    ``@debug_decorator`` or ``@debug_decorator(capture_args=False)``.
    """
    options = _Options(capture_args, log_execution_time, memory_monitoring, logger, level, max_arg_chars)

    def decorate(target: F) -> F:
        return _wrap(target, options)

    if function is not None and callable(function):
        return decorate(function)
    return decorate


def _wrap(target: F, options: _Options) -> F:
    """``target`` wrapped (a coroutine function stays one): before, the call, after."""
    qualname = getattr(target, "__qualname__", getattr(target, "__name__", "function"))
    if inspect.iscoroutinefunction(target):
        @functools.wraps(target)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            if runtime.settings().mode == "off":
                return await target(*args, **kwargs)
            state = _before(target, qualname, options, args, kwargs)
            try:
                result = await target(*args, **kwargs)
            except BaseException as error:
                _after(qualname, options, state, error)
                raise
            _after(qualname, options, state, None)
            return result

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(target)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if runtime.settings().mode == "off":
            return target(*args, **kwargs)
        state = _before(target, qualname, options, args, kwargs)
        try:
            result = target(*args, **kwargs)
        except BaseException as error:
            _after(qualname, options, state, error)
            raise
        _after(qualname, options, state, None)
        return result

    return wrapper  # type: ignore[return-value]


def _before(target: Callable, qualname: str, options: _Options, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Start of a call: the time, the arguments, the memory, and a tracing span. Never raises."""
    state: dict[str, Any] = {"start": time.time(), "perf": time.perf_counter()}
    try:
        if options.capture_args:
            state["args"] = capture_arguments(target, args, kwargs, options.max_arg_chars)
        if options.memory_monitoring:
            state["memory"] = _memory_now()
        state["span"] = Span(qualname, None, {}).__enter__()
    except Exception:
        pass
    return state


def _after(qualname: str, options: _Options, state: dict[str, Any], error: BaseException | None) -> None:
    """End of a call: the log line, then the span (the tracing helper's, else a record). Never raises."""
    try:
        duration = time.perf_counter() - state["perf"]
        token = state.get("phase_token")
        if token is not None:
            try:
                runtime._phase.reset(token)
            except Exception:
                runtime.set_phase(None)
        attrs, parts = _describe_call(qualname, options, state, duration, error)
        _log_line(options.logger, logging.ERROR if error is not None else options.level, ", ".join(parts), duration,
                  qualname)
        _close_span(qualname, state, attrs, duration, error)
    except Exception:
        pass


def _describe_call(qualname: str, options: _Options, state: dict[str, Any], duration: float,
                   error: BaseException | None) -> tuple[dict[str, Any], list[str]]:
    """The span's attributes and the parts of the log line: arguments, duration, memory delta, error."""
    attrs: dict[str, Any] = {}
    parts = [qualname]
    if options.capture_args:
        attrs["args"] = state.get("args", {})
        parts[0] += "(" + ", ".join(f"{k}={v}" for k, v in attrs["args"].items()) + ")"
    if options.log_execution_time:
        parts.append(f"took {duration:.4f} s")
    if options.memory_monitoring and state.get("memory"):
        rss_after, gpu_after = _memory_now()
        rss_before, gpu_before = state["memory"]
        if rss_before is not None and rss_after is not None:
            attrs["memory_delta_bytes"] = rss_after - rss_before
            attrs["rss_bytes"] = rss_after
            parts.append(f"memory {(rss_after - rss_before) / 2**20:+.1f} MiB (rss {rss_after / 2**20:.0f} MiB)")
        if gpu_before is not None and gpu_after is not None:
            attrs["gpu_memory_delta_bytes"] = gpu_after - gpu_before
            parts.append(f"gpu {(gpu_after - gpu_before) / 2**20:+.1f} MiB")
    if error is not None:
        parts.append(f"raised {type(error).__name__}: {redact_text(str(error)[:2000])[:200]}")
    return attrs, parts


def _close_span(qualname: str, state: dict[str, Any], attrs: dict[str, Any], duration: float,
                error: BaseException | None) -> None:
    """Close the tracing helper's span (nesting and layout from its owner), else record a ``span`` ourselves."""
    span = state.get("span")
    if span is not None:
        span.attrs.update(attrs)
        span.__exit__(type(error) if error is not None else None, error, None)
        return
    data = {
        "start": state["start"], "end": state["start"] + duration, "duration_s": duration,
        "span_id": state.get("span_id"), "parent_id": None,
        "attrs": attrs, "thread": threading.get_ident(),
    }
    if error is not None:
        data["error"] = type(error).__name__
    record("span", data, name=qualname, phase=qualname, time_=state["start"])
