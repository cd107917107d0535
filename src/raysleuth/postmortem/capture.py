"""Catching unhandled exceptions: decorators, live instances, and process/thread hooks."""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from raysleuth.postmortem.capsule import SKIPPED_TYPES, capture_exception
from raysleuth.ray_private import function_execution_table, remote_function_body, set_remote_function_body

log = logging.getLogger("raysleuth.postmortem")

T = TypeVar("T")


_MARK = "__raysleuth_capture__"
#: How many captured calls are on this context's stack: only the outermost one captures, so an
#: exception caught and handled by an outer captured method leaves no capsule (it was not fatal).
_depth: contextvars.ContextVar[int] = contextvars.ContextVar("raysleuth_capture_depth", default=0)
def _should_capture(error: BaseException) -> bool:
    return not isinstance(error, SKIPPED_TYPES)  # a cancelled request (asyncio) is not a crash


def _enter() -> contextvars.Token:
    return _depth.set(_depth.get() + 1)


def _leave(token: contextvars.Token) -> None:
    try:
        _depth.reset(token)
    except Exception:  # a generator finished in another context: nothing to undo
        pass


def _crashed(error: BaseException, label: str, outermost: int) -> None:
    """An exception leaves a wrapped call: capture it if no captured caller is above us. Never raises."""
    try:
        if _depth.get() == outermost and _should_capture(error):
            capture_exception(error, method=label)
    except Exception:
        pass


def _wrap_function(fn: Callable[..., Any], label: str | None = None) -> Callable[..., Any]:
    if getattr(fn, _MARK, False):
        return fn
    name = str(label or getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn))))

    # The wrappers reference module-level functions only: Ray pickles them by value (their
    # __module__/__qualname__ are the user's), and module functions travel by reference.
    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def wrapper(*args, **kwargs):
            try:
                async for item in fn(*args, **kwargs):
                    yield item
            except BaseException as error:
                _crashed(error, name, 0)
                raise
    elif inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapper(*args, **kwargs):
            token = _enter()
            try:
                return await fn(*args, **kwargs)
            except BaseException as error:
                _crashed(error, name, 1)
                raise
            finally:
                _leave(token)
    elif inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return (yield from fn(*args, **kwargs))
            except BaseException as error:
                _crashed(error, name, 0)
                raise
    else:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            token = _enter()
            try:
                return fn(*args, **kwargs)
            except BaseException as error:
                _crashed(error, name, 1)
                raise
            finally:
                _leave(token)
    setattr(wrapper, _MARK, True)
    return wrapper


def _public_method_names(cls: type) -> list[str]:
    names = []
    for name in dir(cls):
        if name.startswith("_") and name != "__init__" and name != "__call__":
            continue
        if name.startswith("__ray"):
            continue
        names.append(name)
    return names


def _wrap_class(cls: type) -> type:
    """Wrap ``__init__``, ``__call__`` and every public method of ``cls`` in place; returns ``cls``."""
    for name in _public_method_names(cls):
        try:
            raw = inspect.getattr_static(cls, name)
        except AttributeError:
            continue
        owner = next((base for base in cls.__mro__ if name in vars(base)), None)
        if owner is object or owner is None:
            continue  # object.__init__ and friends
        label = f"{cls.__name__}.{name}"
        try:
            if isinstance(raw, staticmethod):
                wrapped: Any = staticmethod(_wrap_function(raw.__func__, label))
            elif isinstance(raw, classmethod):
                wrapped = classmethod(_wrap_function(raw.__func__, label))
            elif inspect.isfunction(raw):
                wrapped = _wrap_function(raw, label)
            else:
                continue  # properties, class attributes, nested classes
            if wrapped is not raw and not (inspect.isfunction(raw) and getattr(raw, _MARK, False)):
                setattr(cls, name, wrapped)
        except Exception as error:
            log.warning("raysleuth: could not wrap %s: %r", label, error)
    return cls


def _ray_actor_class_target(obj: Any) -> type | None:
    """The class a ``@ray.remote`` ActorClass ships to workers (or None)."""
    metadata = getattr(type(obj), "__ray_metadata__", None) or getattr(obj, "__ray_metadata__", None)
    modified = getattr(metadata, "modified_class", None)
    return modified if isinstance(modified, type) else None


def capture_crashes(target: T | None = None) -> T:
    """Capture a crash capsule whenever an exception escapes ``target``, then re-raise it unchanged.

    ``target`` may be a function (sync, async, generator), a method, a class
    (wraps ``__init__``, ``__call__`` and its public methods), a Ray actor
    class (``@ray.remote`` applied before or after), or a Ray remote
    function. Use it bare (``@capture_crashes``), called
    (``@capture_crashes()``), or as ``capture_crashes(cls_or_fn)``.
    """
    if target is None:
        return capture_crashes  # type: ignore[return-value]
    if isinstance(target, type):
        return _wrap_class(target)  # type: ignore[return-value]
    modified = _ray_actor_class_target(target)
    if modified is not None:
        _wrap_class(modified)
        return target

    remote_function = remote_function_body(target)
    if remote_function is not None:
        if not set_remote_function_body(target, _wrap_function(remote_function)):
            log.warning("raysleuth: %r was already shipped to the cluster; wrap it before its first .remote()",
                        target)
        return target
    if callable(target):
        return _wrap_function(target)  # type: ignore[return-value]  # the same callable, wrapped
    raise TypeError(f"capture_crashes needs a function, method or class, got {type(target).__name__}")


def install_crash_capture_on_instance(obj: Any) -> Any:
    """Wrap the public methods of an existing object in place (for live actors, through ``__ray_call__``).

    Inside a Ray actor the worker dispatches calls through executors it
    built when the actor started, so those are rewrapped too: calls that
    arrive after this returns are captured. Returns ``obj``.
    """
    cls = type(obj)
    wrapped_names = []
    for name in _public_method_names(cls):
        if name in ("__init__",):
            continue
        try:
            raw = inspect.getattr_static(cls, name)
        except AttributeError:
            continue
        if not inspect.isfunction(raw) or getattr(raw, _MARK, False):
            continue
        try:
            bound = getattr(obj, name)
            setattr(obj, name, _wrap_function(bound, f"{cls.__name__}.{name}"))
            wrapped_names.append(name)
        except Exception as error:
            log.warning("raysleuth: could not wrap %s.%s: %r", cls.__name__, name, error)
    _rewrap_ray_executors(cls, set(wrapped_names))
    return obj


def _rewrap_ray_executors(cls: type, names: set[str]) -> None:
    """Inside a Ray actor: make the executors Ray built for this actor's methods call wrapped methods.

    Ray's task loop caches each method's executor (a closure over the
    unbound method), so the closure cell is rewritten in place.
    """
    ray = sys.modules.get("ray")
    if ray is None or not names:
        return
    try:
        table = function_execution_table()
        class_names = {base.__name__ for base in cls.__mro__}
        for info in list(table.values()):
            executor = getattr(info, "function", None)
            name = getattr(executor, "name", None)
            method = getattr(executor, "method", None)
            if executor is None or name not in names or method is None or getattr(method, _MARK, False):
                continue
            if getattr(method, "__qualname__", "").split(".")[0] not in class_names:
                continue
            freevars = executor.__code__.co_freevars
            if "method" not in freevars or executor.__closure__ is None:
                continue
            wrapped = _wrap_function(method, f"{cls.__name__}.{name}")
            executor.__closure__[freevars.index("method")].cell_contents = wrapped
            executor.method = wrapped
    except Exception as error:  # Ray internals moved: direct calls on the instance are still captured
        log.warning("raysleuth: could not wrap Ray's actor executors: %r", error)


# ------------------------------------------------------------ process hooks

_installed = False
_install_lock = threading.Lock()


def install_crash_capture() -> bool:
    """Capture unhandled exceptions of this process (``sys.excepthook``) and its threads.

    Idempotent: a second call changes nothing. Returns True when it
    installed the hooks now, False when they were installed already.
    """
    global _installed
    with _install_lock:
        if _installed:
            return False
        previous_hook = sys.excepthook
        previous_thread_hook = threading.excepthook

        def excepthook(kind, value, tb):
            try:
                if value is not None and _should_capture(value):
                    if value.__traceback__ is None and tb is not None:
                        value = value.with_traceback(tb)
                    capture_exception(value, method="sys.excepthook")
            except Exception:
                pass
            previous_hook(kind, value, tb)

        def thread_excepthook(args):
            try:
                value = args.exc_value
                if value is not None and _should_capture(value):
                    name = getattr(args.thread, "name", None) or "thread"
                    capture_exception(value, method=f"thread:{name}")
            except Exception:
                pass
            previous_thread_hook(args)

        excepthook.__raysleuth_capture__ = True  # type: ignore[attr-defined]
        thread_excepthook.__raysleuth_capture__ = True  # type: ignore[attr-defined]
        sys.excepthook = excepthook
        threading.excepthook = thread_excepthook
        _installed = True
        return True


# ------------------------------------------------------------- reading back
