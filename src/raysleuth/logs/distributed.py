"""``DistributedLogger`` (aggregation and memory alerts) and ``debug_decorator``.

- :class:`DistributedLogger` is a rank-aware stdlib logger (it delegates to
  :func:`~raysleuth.logs.get_logger`) plus two helpers: every
  ``aggregation_interval`` seconds it can read the run's new ``log`` records
  and print them aggregated across ranks (never hiding a rank that differs),
  and a background sampler logs a WARNING (with rank and phase) when this
  node's memory, or this process's GPU, passes ``alert_threshold`` of its
  capacity.
- :func:`debug_decorator` wraps a function: redacted, truncated arguments,
  duration and memory delta, logged and recorded as a ``span``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from raysleuth import runtime
from raysleuth.modes import mode_config
from raysleuth.redaction import REDACTED, redact_text, redact_value, redacted_repr
from raysleuth.logs.aggregate import AggregatedLine, LogItem, aggregate
from raysleuth.logs.loggers import get_logger

__all__ = ["DistributedLogger", "MemoryReading", "debug_decorator", "memory_alert", "read_memory"]

F = TypeVar("F", bound=Callable[..., Any])


# ------------------------------------------------------------------ memory


@dataclass
class MemoryReading:
    """How full this node (and this process's GPU) is."""

    host_used_bytes: int | None = None
    host_total_bytes: int | None = None
    gpu_used_bytes: int | None = None
    gpu_total_bytes: int | None = None
    rss_bytes: int | None = None

    def fractions(self) -> dict[str, float]:
        """Used fraction per device that reported one (``host``, ``gpu``)."""
        result = {}
        if self.host_used_bytes is not None and self.host_total_bytes:
            result["host"] = self.host_used_bytes / self.host_total_bytes
        if self.gpu_used_bytes is not None and self.gpu_total_bytes:
            result["gpu"] = self.gpu_used_bytes / self.gpu_total_bytes
        return result


def read_memory() -> MemoryReading:
    """Node memory (psutil) and, when CUDA is initialised in this process, GPU memory."""
    reading = MemoryReading()
    try:
        import psutil

        virtual = psutil.virtual_memory()
        reading.host_total_bytes = int(virtual.total)
        reading.host_used_bytes = int(virtual.total - virtual.available)
        reading.rss_bytes = int(psutil.Process().memory_info().rss)
    except Exception:
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                free, total = torch.cuda.mem_get_info()
                reading.gpu_used_bytes, reading.gpu_total_bytes = int(total - free), int(total)
        except Exception:
            pass
    return reading


def memory_alert(fractions: dict[str, float], threshold: float) -> str | None:
    """The alert text when a device's used fraction passes ``threshold``, else ``None``."""
    over = {device: used for device, used in fractions.items() if used >= threshold}
    if not over:
        return None
    parts = ", ".join(f"{device} {used:.0%}" for device, used in sorted(over.items()))
    return f"memory above {threshold:.0%} of capacity: {parts}"


# ---------------------------------------------------------- the logger


class DistributedLogger:
    """A rank-aware logger with cross-rank aggregation and a memory alert.

    Use it like a stdlib logger (``.info(msg, rank=...)``, ``.warning``,
    ``.addHandler``...: every attribute comes from the underlying
    ``logging.Logger``, :attr:`logger`). On top:

    - :meth:`aggregated` returns the run's ``log`` records of this logger
      since the last call, aggregated across ranks (pure
      :func:`~raysleuth.logs.aggregate.aggregate`). :meth:`start_aggregation`
      prints them every ``aggregation_interval`` seconds through the
      ``<name>.aggregate`` logger (on the driver, where the store is read).
    - a daemon thread samples memory every ``memory_interval`` seconds
      (default: the mode's, 10 s light, 1 s full; none when off) and logs one
      WARNING with rank and phase when use passes ``alert_threshold`` of the
      node's (or GPU's) capacity; it re-arms when use falls back below.
    """

    def __init__(self, name: str | None = None, aggregation_interval: float = 10.0, alert_threshold: float = 0.9,
                 *, memory_interval: float | None = None, monitor_memory: bool = True, **options: Any) -> None:
        self.logger = get_logger(name, **options)
        self.name = self.logger.name
        self.aggregation_interval = float(aggregation_interval)
        self.alert_threshold = float(alert_threshold)
        self.alerts: list[str] = []
        self._last_id: int | None = None
        self._stop = threading.Event()
        self._alerting = False
        self._threads: list[threading.Thread] = []
        if memory_interval is None:
            try:
                memory_interval = mode_config(runtime.settings().mode).memory_interval_s
            except Exception:
                memory_interval = 10.0
        self.memory_interval = memory_interval
        if monitor_memory and memory_interval and runtime.settings().mode != "off":
            self._spawn(self._memory_loop, "raysleuth-memory-alert")

    # stdlib logger surface
    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.logger, attribute)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # ----------------------------------------------------------- memory

    def check_memory(self, reading: MemoryReading | None = None) -> str | None:
        """Sample memory now; log (once per crossing) and return the alert text, else ``None``."""
        try:
            reading = reading or read_memory()
            alert = memory_alert(reading.fractions(), self.alert_threshold)
            if alert is None:
                self._alerting = False
                return None
            if not self._alerting:
                self._alerting = True
                me = runtime.whoami()
                phase = runtime.current_phase()
                text = f"{alert} (rank {me.rank if me.rank is not None else '?'}, phase {phase or '-'}, " \
                       f"pid {me.pid}, rss {((reading.rss_bytes or 0) / 2**20):.0f} MiB)"
                self.alerts.append(text)
                self.logger.warning(text, memory_fractions=reading.fractions(), alert="memory")
            return alert
        except Exception:
            return None

    def _memory_loop(self) -> None:
        while not self._stop.wait(self.memory_interval):
            if runtime.settings().mode != "off":
                self.check_memory()

    # ------------------------------------------------------ aggregation

    def aggregated(self, *, run: str | None = None, home: Any = None, since: float | None = None,
                   all_loggers: bool = False) -> list[AggregatedLine]:
        """This logger's records (all loggers with ``all_loggers``) since the last call, aggregated."""
        from raysleuth.recorder import open_store

        store = open_store(run, home=home)
        try:
            records = store.query("log", after_id=self._last_id, since=since)
        finally:
            store.close()
        if records:
            self._last_id = records[-1].id if self._last_id is None else max(self._last_id, max(r.id for r in records))
        if not all_loggers:
            records = [r for r in records if r.name == self.name or (r.name or "").startswith(self.name + ".")]
        return aggregate(LogItem.from_record(r) for r in records)

    def start_aggregation(self, *, run: str | None = None, home: Any = None) -> None:
        """Print the aggregated lines every ``aggregation_interval`` s (``<name>.aggregate`` logger)."""
        output = logging.getLogger(f"{self.name}.aggregate")
        output.propagate = False
        if not output.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(message)s"))
            output.addHandler(handler)
        output.setLevel(logging.INFO)
        self._last_id = self._last_id or self._newest_id(run, home)

        def loop() -> None:
            while not self._stop.wait(self.aggregation_interval):
                try:
                    from raysleuth.recorder import get_client

                    get_client().flush(timeout=2.0)
                    for line in self.aggregated(run=run, home=home):
                        output.log(logging.getLevelName(line.level) if isinstance(
                            logging.getLevelName(line.level), int) else logging.INFO,
                            line.text(), extra={"raysleuth_aggregate": True})
                except Exception:
                    pass

        self._spawn(loop, "raysleuth-log-aggregation")

    @staticmethod
    def _newest_id(run: str | None, home: Any) -> int | None:
        try:
            from raysleuth.recorder import open_store

            store = open_store(run, home=home)
            try:
                newest = store.query("log", newest_first=True, limit=1)
            finally:
                store.close()
            return newest[0].id if newest else None
        except Exception:
            return None

    def close(self) -> None:
        """Stop the background threads."""
        self._stop.set()


# -------------------------------------------------------------- decorator

_span_ids = itertools.count(1)


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

    def decorate(target: F) -> F:
        qualname = getattr(target, "__qualname__", getattr(target, "__name__", "function"))

        def before(args: tuple, kwargs: dict) -> dict[str, Any]:
            state: dict[str, Any] = {"start": time.time(), "perf": time.perf_counter()}
            try:
                if capture_args:
                    state["args"] = capture_arguments(target, args, kwargs, max_arg_chars)
                if memory_monitoring:
                    state["memory"] = _memory_now()
                from raysleuth.tracing import Span

                state["span"] = Span(qualname, None, {}).__enter__()
            except Exception:
                pass
            return state

        def after(state: dict[str, Any], error: BaseException | None) -> None:
            try:
                duration = time.perf_counter() - state["perf"]
                end = state["start"] + duration
                token = state.get("phase_token")
                if token is not None:
                    try:
                        runtime._phase.reset(token)
                    except Exception:
                        runtime.set_phase(None)
                span = state.get("span")
                attrs: dict[str, Any] = {}
                parts = [qualname]
                if capture_args:
                    attrs["args"] = state.get("args", {})
                    parts[0] += "(" + ", ".join(f"{k}={v}" for k, v in attrs["args"].items()) + ")"
                if log_execution_time:
                    parts.append(f"took {duration:.4f} s")
                if memory_monitoring and state.get("memory"):
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
                _log_line(logger, logging.ERROR if error is not None else level, ", ".join(parts), duration,
                          qualname)
                if span is not None:  # the tracing helper's span: nesting and layout from its owner
                    span.attrs.update(attrs)
                    span.__exit__(type(error) if error is not None else None, error, None)
                    return
                data = {
                    "start": state["start"], "end": end, "duration_s": duration,
                    "span_id": state.get("span_id"), "parent_id": None,
                    "attrs": attrs, "thread": threading.get_ident(),
                }
                if error is not None:
                    data["error"] = type(error).__name__
                from raysleuth.recorder import record

                record("span", data, name=qualname, phase=qualname, time_=state["start"])
            except Exception:
                pass

        if inspect.iscoroutinefunction(target):
            @functools.wraps(target)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if runtime.settings().mode == "off":
                    return await target(*args, **kwargs)
                state = before(args, kwargs)
                try:
                    result = await target(*args, **kwargs)
                except BaseException as error:
                    after(state, error)
                    raise
                after(state, None)
                return result

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(target)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if runtime.settings().mode == "off":
                return target(*args, **kwargs)
            state = before(args, kwargs)
            try:
                result = target(*args, **kwargs)
            except BaseException as error:
                after(state, error)
                raise
            after(state, None)
            return result

        return wrapper  # type: ignore[return-value]

    if function is not None and callable(function):
        return decorate(function)
    return decorate
