"""Spans, instant events and detailed Ray-call tracing: what each rank did, and when.

- ``with rs.span("rollout", step=i, **attrs):`` times a block. While it is
  open, :func:`raysleuth.runtime.current_phase` is its name (records written
  inside carry it); spans nest (``parent_id``). On exit one ``span`` record
  goes to the evidence store through the batching client: a deque append,
  about a microsecond (``bench/bench_spans.py``).
- ``@rs.trace`` (or ``@rs.trace(name=..., **attrs)``) wraps a function or
  method (sync or async) in a span named for its qualified name.
- ``rs.event(name, **data)`` records an instant event.
- ``with enable_detailed_tracing():`` traces every Ray task and actor call
  submitted inside the block: while it is active, ``RemoteFunction._remote``
  and ``ActorMethod._remote`` are wrapped; each call records a ``span`` named
  ``ray.call:<function>`` from submission to the moment its result is ready
  (seen from the submitter), with the task id so the timeline can join it to
  the State API's view of the same task. The originals come back on exit.

Every instrument here catches its own errors: tracing never breaks the
traced code. With ``RAYSLEUTH_MODE=off`` spans are one flag check.

Record layout (kind ``span``): ``name`` = span name, ``time`` = start,
``step`` = the span's step, ``phase`` = the span's name, data
``{"start", "end", "duration_s", "span_id", "parent_id", "attrs", "thread"}``
(plus ``"error"`` when the block raised). Kind ``event``: ``name``, data.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar, overload

from raysleuth import ray_private, runtime
from raysleuth.recorder import get_client, record
from raysleuth.recorder.spans import register_lazy_data
from raysleuth.recorder.spans import DRAINER, SPAN_CAPACITY, SPAN_FIELDS, SPAN_WAKE, SPANS, span_dropped

__all__ = ["Span", "enable_detailed_tracing", "event", "span", "trace", "detailed_tracing_active"]

F = TypeVar("F", bound=Callable[..., Any])

_span_ids = itertools.count(1)
_now = time.time
_thread_id = threading.get_ident
_scope = runtime._phase  # the innermost span or phase (name, span_id), set directly on the hot path
_step_var = runtime._step  # the step contextvar, read directly on the hot path
_queue = SPANS.extend  # the fields, not a tuple: nothing the garbage collector follows is left behind
_SPANS_MAX = SPAN_CAPACITY * SPAN_FIELDS
_WAKE_AT = SPAN_WAKE * SPAN_FIELDS


class Span:
    """A timed block (use :func:`span`). Records one ``span`` on exit.

    The hot path (``bench/bench_spans.py``, target < 1 µs per span) reads the
    settings and the step context variable directly, sets two context
    variables, reads the clock twice and extends the client's span deque
    (:data:`raysleuth.recorder.spans.SPANS`) by the span's plain fields: no
    keyword parsing, no extra lookups, no call into the client (but once per
    drained batch).
    """

    __slots__ = ("name", "step", "attrs", "start", "end", "span_id", "parent_id", "_token")

    def __init__(self, name: str, step: int | None = None, attrs: dict[str, Any] | None = None) -> None:
        self.name = name
        self.step = step
        self.attrs = attrs
        self.end = 0.0
        self._token: contextvars.Token | None = None  # set while the span records

    def __enter__(self) -> "Span":
        try:
            if (runtime._settings or runtime.settings()).mode == "off":
                self.start = 0.0
                return self
            self.span_id = next(_span_ids)
            outer = _scope.get()  # the open span (or phase): its id is this span's parent
            self.parent_id = None if outer is None else outer.span_id
            if self.step is None:
                step = _step_var.get()
                self.step = step if step is not None else runtime.last_step_box[0]
            self._token = _scope.set(self)  # the span is the scope: its name is the phase, its id the parent
            self.start = _now()
        except Exception:
            self._token = None
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        token = self._token
        if token is None:
            return False
        end = self.end = _now()
        try:
            _scope.reset(token)
        except Exception:  # exited in another context (generators): put back the scope it opened in
            try:
                _scope.set(None if token.old_value is contextvars.Token.MISSING else token.old_value)
            except Exception:
                pass
        try:
            # The span's fields onto the spans' deque in one extend (hot path, see bench/bench_spans.py): the
            # process client's thread makes the row (rank, sequence number) and _span_data its dict.
            waiting = len(SPANS)
            if waiting < _SPANS_MAX:
                _queue((self.start, end, self.step, self.name, self.span_id, self.parent_id, self.attrs,
                        _thread_id(), None if exc_type is None else exc_type.__name__, runtime._rank_cache))
            else:
                span_dropped()
            if not waiting % _WAKE_AT:  # none waited (just drained, or no drainer yet), or a batch's worth waits
                drainer = DRAINER[0]
                if drainer is None:
                    get_client().drain_spans()  # the first span, a new process client, or a provisional one
                elif waiting:
                    drainer.nudge()
        except Exception:
            pass
        return False

    @property
    def duration_s(self) -> float:
        """Seconds the block took (0 while open or when tracing is off)."""
        return max(0.0, self.end - self.start) if self.end else 0.0


def _span_data(payload: tuple) -> dict[str, Any]:
    """A span row's data from the plain tuple :meth:`Span.__exit__` queued."""
    start, end, span_id, parent_id, attrs, thread, error = payload
    data = {"start": start, "end": end, "duration_s": end - start, "span_id": span_id, "parent_id": parent_id,
            "attrs": attrs or {}, "thread": thread}
    if error is not None:
        data["error"] = error
    return data


register_lazy_data("span", _span_data)


def span(name: str, step: int | None = None, **attrs: Any) -> Span:
    """Time a block as a span named ``name`` (its step: ``step`` or the current step).

    ``attrs`` are stored with the span (keep them small and JSON-friendly).
    """
    return Span(name, step, attrs or None)


def event(name: str, **data: Any) -> None:
    """Record an instant event ``name`` with ``data``. Never raises."""
    try:
        record("event", data, name=name)
    except Exception:
        pass


@overload
def trace(function: F) -> F: ...


@overload
def trace(function: None = None, *, name: str | None = None, **attrs: Any) -> Callable[[F], F]: ...


def trace(function: Callable | None = None, *, name: str | None = None, **attrs: Any):
    """Decorator: run a function or method inside a span named for it.

    ``@rs.trace`` or ``@rs.trace(name="rollout", model="actor")``. Works on
    plain functions, methods (the span is named ``Class.method``) and
    coroutine functions. The span's step is the current step.
    """

    def decorate(target: F) -> F:
        span_name = str(name or getattr(target, "__qualname__", None) or getattr(target, "__name__", "function"))
        extra = attrs or None
        if inspect.iscoroutinefunction(target):
            @functools.wraps(target)
            async def async_wrapper(*args, **kwargs):
                with Span(span_name, None, extra):
                    return await target(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(target)
        def wrapper(*args, **kwargs):
            with Span(span_name, None, extra):
                return target(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    if function is not None:
        if not callable(function):
            raise TypeError(f"rs.trace decorates functions and methods, got {type(function).__name__}")
        return decorate(function)
    return decorate


# ------------------------------------------------------------ detailed tracing

_patch_lock = threading.Lock()
_active_blocks = 0
_originals: dict[str, Callable] = {}
_enabled_here: contextvars.ContextVar[bool] = contextvars.ContextVar("raysleuth_detailed", default=False)
_completion: contextvars.ContextVar[bool] = contextvars.ContextVar("raysleuth_completion", default=False)


def detailed_tracing_active() -> bool:
    """True while an :func:`enable_detailed_tracing` block is open in this context."""
    return _enabled_here.get()


def _traced(kind: str, original: Callable) -> Callable:
    def traced_remote(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if not _enabled_here.get():
            return result
        try:
            _record_call(kind, self, result, kwargs)
        except Exception:
            pass
        return result

    traced_remote.__wrapped__ = original  # type: ignore[attr-defined]
    traced_remote._raysleuth_traced = True  # type: ignore[attr-defined]
    return traced_remote


def _record_call(kind: str, target: Any, result: Any, kwargs: dict) -> None:
    start = _now()
    ref = result[0] if isinstance(result, list) and result else result
    task_id = None
    try:
        task_id = ref.task_id().hex()
    except Exception:
        ref = None
    label = ray_private.submission_label(kind, target)
    if kind == "actor_call":
        try:
            actor_id = ray_private.actor_id_hex(ray_private.actor_of_method(target))
        except Exception:
            actor_id = None
    else:
        actor_id = None
    step = runtime.current_step()
    scope = _scope.get()
    parent = None if scope is None else scope.span_id
    span_id = next(_span_ids)
    phase = runtime.current_phase()

    def done(_=None) -> None:
        end = _now()
        record("span", {
            "start": start, "end": end, "duration_s": end - start, "span_id": span_id, "parent_id": parent,
            "attrs": {"task_id": task_id, "call": kind, "function": label, "actor_id": actor_id,
                      "submitted_in_phase": phase},
            "thread": threading.get_ident(),
        }, name=f"ray.call:{label}", step=step, phase=phase, time_=start)

    if ref is not None and _completion.get() and hasattr(ref, "_on_completed"):
        ref._on_completed(done)
    else:
        done()


def _install() -> None:
    # lazy: the private Ray names load only when detailed tracing is switched on
    from raysleuth.ray_private import submission_classes

    RemoteFunction, ActorMethod = submission_classes()  # noqa: N806  (a clear error if Ray moved them)

    if "task" not in _originals:
        _originals["task"] = RemoteFunction._remote
        RemoteFunction._remote = _traced("task", RemoteFunction._remote)
    if "actor_call" not in _originals:
        _originals["actor_call"] = ActorMethod._remote
        ActorMethod._remote = _traced("actor_call", ActorMethod._remote)


def _uninstall() -> None:
    # lazy: as in _install
    from raysleuth.ray_private import submission_classes

    RemoteFunction, ActorMethod = submission_classes()  # noqa: N806

    original = _originals.pop("task", None)
    if original is not None:
        RemoteFunction._remote = original
    original = _originals.pop("actor_call", None)
    if original is not None:
        ActorMethod._remote = original


@contextlib.contextmanager
def enable_detailed_tracing(*, completion: bool = False) -> Iterator[None]:
    """Trace every Ray task and actor call submitted inside this block.

    Each call becomes a ``span`` record ``ray.call:<function>`` with
    ``attrs.task_id``: by default it spans the submission itself (cheap; the
    execution comes from the State API in the timeline). ``completion=True``
    makes it last until the result is ready (a Ray completion callback per
    call: costly, see bench/bench_detailed_tracing.py). The
    timeline joins it to the task's own lifecycle from the State API.
    Nested and concurrent blocks are fine; Ray is unpatched when the last
    block exits. Calls submitted by other threads outside a block are not
    traced.
    """
    global _active_blocks
    installed = False
    try:
        with _patch_lock:
            _install()
            _active_blocks += 1
            installed = True
    except Exception:  # no Ray, or Ray moved things: run untraced rather than fail
        installed = False
    token = _enabled_here.set(True)
    completion_token = _completion.set(completion)
    try:
        yield
    finally:
        _completion.reset(completion_token)
        _enabled_here.reset(token)
        if installed:
            with _patch_lock:
                _active_blocks -= 1
                if _active_blocks == 0:
                    try:
                        _uninstall()
                    except Exception:
                        pass
