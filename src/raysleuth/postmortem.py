"""Crash capsules: what a worker knew when it died, kept after it is gone.

``@capture_crashes`` (on a function, a method or a whole actor class) and
:func:`install_crash_capture` (``sys.excepthook`` and
``threading.excepthook``) catch an unhandled exception on its way out,
write a **crash capsule** to the evidence store (record kind ``crash``),
flush the recorder synchronously (bounded), and re-raise the very same
exception object. The capsule holds: who (rank, node, pid, actor, method),
what (exception type, message, ``__cause__``/``__context__`` chain,
formatted traceback), the locals of every frame as truncated, redacted
``repr`` strings, memory at the time (psutil; torch.cuda when CUDA is up),
the relevant environment (redacted), and the likely cause and fix from
:func:`raysleuth.explain.explain`.

Capture never changes or masks the user's exception: everything it does is
inside ``try/except`` and bounded in time. ``RAYSLEUTH_POST_MORTEM=1``
(alias ``RAY_DEBUG_POST_MORTEM``) also opens a post-mortem debugger session
at the crash (``raysleuth.breakpoints.post_mortem_session``), with the
breakpoint wait limit.

:func:`redact` is the one place that decides what is a secret; the logs and
decorators reuse it.
"""

from __future__ import annotations

import dataclasses
import functools
import contextvars
import inspect
import logging
import os
import re
import reprlib
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from raysleuth import runtime

__all__ = [
    "CrashCapsule",
    "CrashSummary",
    "REDACTED",
    "build_capsule",
    "capture_crashes",
    "capture_exception",
    "get_crash",
    "install_crash_capture",
    "install_crash_capture_on_instance",
    "list_crashes",
    "looks_like_secret_name",
    "looks_like_token",
    "redact",
    "redact_text",
    "relevant_environment",
    "safe_repr",
]

log = logging.getLogger("raysleuth.postmortem")

T = TypeVar("T")

REDACTED = "<redacted>"

#: Names (of variables, keys, environment variables) whose values are secrets.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|PWD|CREDENTIAL|AUTH|COOKIE|PRIVATE", re.IGNORECASE)
#: Names that match the pattern above but hold no secret.
_NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD", "KEYBOARD", "SORT_KEY", "KEY_FUNC"})

#: Token shapes recognised inside free text (messages, tracebacks, reprs).
_INLINE_TOKENS = re.compile(
    r"(?:"
    r"\bsk-[A-Za-z0-9_\-]{16,}"                       # OpenAI-style keys
    r"|\bhf_[A-Za-z0-9]{20,}"                          # Hugging Face tokens
    r"|\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}"     # GitHub tokens
    r"|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bxox[abposr]-[A-Za-z0-9\-]{10,}"               # Slack tokens
    r"|\bAKIA[0-9A-Z]{16}\b"                           # AWS access key ids
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"  # JWTs
    r"|(?<=Bearer )[A-Za-z0-9._~+/=\-]{8,}"            # Authorization: Bearer ...
    r")"
)
#: ``name=value`` / ``'name': 'value'`` pairs whose name says "secret".
_INLINE_ASSIGNMENT = re.compile(
    r"(?P<key>['\"]?[A-Za-z0-9_.\-]*(?:token|secret|key|password|passwd|credential|auth)[A-Za-z0-9_.\-]*['\"]?"
    r"\s*[:=]\s*)(?P<quote>['\"]?)(?P<value>[^\s'\",}\)\]]+)",
    re.IGNORECASE,
)
#: A whole value that is one long hex or base64-ish word looks like a token.
_HEX_TOKEN = re.compile(r"[0-9a-fA-F]{32,}")
_B64_TOKEN = re.compile(r"[A-Za-z0-9+/_\-]{32,}={0,2}")


def looks_like_secret_name(name: str | None) -> bool:
    """True when a variable/key/environment name says its value is a secret."""
    if not name:
        return False
    upper = str(name).upper()
    if upper in _NOT_SECRET_NAMES:
        return False
    return _SECRET_NAME.search(upper) is not None


def looks_like_token(value: str) -> bool:
    """True when a whole string value looks like a credential (long hex/base64, sk-, hf_, ghp_, Bearer ...)."""
    if not isinstance(value, str):
        return False
    text = value.strip()
    if len(text) < 8 or len(text) > 4096:
        return False
    if _INLINE_TOKENS.search(text):
        return True
    if " " in text or "/" in text.strip("=")[:1]:
        return False
    if _HEX_TOKEN.fullmatch(text):
        return True
    if _B64_TOKEN.fullmatch(text):
        # Mixed classes: a path-free word with upper, lower and digits (not a plain identifier).
        return (any(c.isupper() for c in text) and any(c.islower() for c in text)
                and any(c.isdigit() for c in text))
    return False


def redact_text(text: str) -> str:
    """Free text with token-shaped substrings and ``secret_name=value`` pairs replaced by ``<redacted>``."""
    if not text:
        return text
    try:
        text = _INLINE_TOKENS.sub(REDACTED, text)
        return _INLINE_ASSIGNMENT.sub(
            lambda m: m.group("key") + m.group("quote") + (m.group("value") if m.group("value") == REDACTED
                                                           else REDACTED),
            text,
        )
    except Exception:
        return text


def redact(name: str | None, value: Any) -> Any:
    """The value to keep for ``name``: ``<redacted>`` when the name or the value looks secret.

    Strings that are not secrets as a whole still have token-shaped pieces
    replaced; other values are returned unchanged unless the name is secret.
    """
    if looks_like_secret_name(name):
        return REDACTED
    if isinstance(value, str):
        if looks_like_token(value):
            return REDACTED
        return redact_text(value)
    return value


_repr = reprlib.Repr()
_repr.maxstring = 240
_repr.maxother = 240
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxfrozenset = _repr.maxdeque = 20
_repr.maxdict = 20
_repr.maxlevel = 3


def _array_summary(value: Any) -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if isinstance(value, torch.Tensor):
                return f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device})"
        except Exception:
            return None
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            if isinstance(value, numpy.ndarray):
                return f"ndarray(shape={value.shape}, dtype={value.dtype})"
        except Exception:
            return None
    return None


def safe_repr(value: Any, limit: int = 300) -> str:
    """A bounded ``repr`` that never raises (tensors and arrays summarised, long text cut)."""
    try:
        text = _array_summary(value) or _repr.repr(value)
    except Exception as error:
        text = f"<repr failed: {type(error).__name__}>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _redacted_repr(name: str, value: Any, limit: int = 300) -> str:
    if looks_like_secret_name(name):
        return REDACTED
    if isinstance(value, str) and looks_like_token(value):
        return REDACTED
    return redact_text(safe_repr(value, limit))


# ------------------------------------------------------------ environment

_ENV_NAMES = frozenset({
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "ROLE_RANK",
    "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "OMP_NUM_THREADS", "PYTHONPATH", "VIRTUAL_ENV",
    "HOSTNAME", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
})
_ENV_PREFIXES = ("RAY_", "RAYSLEUTH_", "NCCL_", "MASTER_", "TORCH_", "TORCHELASTIC_", "VERL_", "VLLM_",
                 "HF_", "HUGGING_FACE_", "CUDA_", "TORCHINDUCTOR_", "GLOO_", "PYTORCH_")


def relevant_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables that matter for a distributed crash, redacted."""
    env = os.environ if env is None else env
    kept = {}
    for name in sorted(env):
        if name in _ENV_NAMES or name.startswith(_ENV_PREFIXES):
            value = redact(name, env[name])
            kept[name] = value if len(value) <= 500 else value[:497] + "..."
    return kept


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

    def to_dict(self) -> dict[str, Any]:
        """The capsule as a JSON-ready dict."""
        return dataclasses.asdict(self)


_MAX_FRAMES = 40
_MAX_LOCALS = 60
_MAX_CHAIN = 8
_OWN_FILE = os.path.normcase(os.path.abspath(__file__))


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
    chain, seen = [], set()
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
        if os.path.normcase(os.path.abspath(code.co_filename)) == _OWN_FILE:
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
        me = runtime.whoami()
    except Exception as error:  # pragma: no cover - whoami catches its own failures
        errors.append(f"whoami: {error!r}")
        me = runtime.Identity(rank=None, world_size=None, local_rank=None, rank_source="none",
                              pid=os.getpid(), hostname="")
    try:
        described = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        described.stack = traceback.StackSummary.from_list(  # drop our own wrapper frames
            [frame for frame in described.stack
             if os.path.normcase(os.path.abspath(frame.filename)) != _OWN_FILE])
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
_FLUSH_TIMEOUT = 5.0


def _already_captured(exc: BaseException) -> bool:
    """True when this exception object was captured already (no reference to it is kept)."""
    key = (id(exc), id(exc.__traceback__), type(exc))
    with _recent_lock:
        if key in _recent:
            return True
        _recent.append(key)
        return False


def capture_exception(exc: BaseException, *, method: str | None = None, flush_timeout: float = _FLUSH_TIMEOUT,
                      post_mortem: bool | None = None) -> CrashCapsule | None:
    """Write a crash capsule for ``exc`` now (and flush, bounded). Never raises; returns the capsule or None.

    The same exception object is captured once, however many wrapped calls
    it passes through on its way out.
    """
    try:
        if runtime.settings().mode == "off" or _already_captured(exc):
            return None
        capsule = build_capsule(exc, method=method)
        from raysleuth.recorder import get_client, record

        label = ".".join(part for part in (capsule.actor_class, (method or "").rsplit(".", 1)[-1]) if part)
        record("crash", capsule.to_dict(), name=label or method or capsule.exception_type, level="ERROR")
        get_client().flush(timeout=flush_timeout)
    except Exception as error:
        log.warning("raysleuth: crash capture failed (%r); the exception is re-raised unchanged", error)
        capsule = None
    if post_mortem if post_mortem is not None else _post_mortem_enabled():
        _open_post_mortem(exc, method)
    return capsule


def _post_mortem_enabled() -> bool:
    try:
        return bool(runtime.settings().post_mortem)
    except Exception:
        return False


def _open_post_mortem(exc: BaseException, method: str | None) -> None:
    try:
        from raysleuth.breakpoints import post_mortem_session  # built by the breakpoints feature

        post_mortem_session(exc, name=f"post-mortem:{method or _type_name(exc)}")  # exception + its traceback
    except BaseException as error:  # a debugger session must never change the crash
        log.warning("raysleuth: post-mortem session not opened (%r)", error)


# -------------------------------------------------------------- wrapping

_MARK = "__raysleuth_capture__"
#: How many captured calls are on this context's stack: only the outermost one captures, so an
#: exception caught and handled by an outer captured method leaves no capsule (it was not fatal).
_depth: contextvars.ContextVar[int] = contextvars.ContextVar("raysleuth_capture_depth", default=0)
_SKIP = (SystemExit, KeyboardInterrupt, GeneratorExit)


def _should_capture(error: BaseException) -> bool:
    return not isinstance(error, _SKIP)


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
    label = label or getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))

    # The wrappers reference module-level functions only: Ray pickles them by value (their
    # __module__/__qualname__ are the user's), and module functions travel by reference.
    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def wrapper(*args, **kwargs):
            try:
                async for item in fn(*args, **kwargs):
                    yield item
            except BaseException as error:
                _crashed(error, label, 0)
                raise
    elif inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapper(*args, **kwargs):
            token = _enter()
            try:
                return await fn(*args, **kwargs)
            except BaseException as error:
                _crashed(error, label, 1)
                raise
            finally:
                _leave(token)
    elif inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return (yield from fn(*args, **kwargs))
            except BaseException as error:
                _crashed(error, label, 0)
                raise
    else:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            token = _enter()
            try:
                return fn(*args, **kwargs)
            except BaseException as error:
                _crashed(error, label, 1)
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
    remote_function = getattr(target, "_function", None)
    if remote_function is not None and callable(remote_function) and hasattr(target, "_function_descriptor"):
        if getattr(target, "_pickled_function", None) is not None:
            log.warning("raysleuth: %r was already shipped to the cluster; wrap it before its first .remote()",
                        target)
        target._function = _wrap_function(remote_function)  # type: ignore[attr-defined]
        return target
    if callable(target):
        return _wrap_function(target)  # type: ignore[arg-type, return-value]
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
        from ray._private import worker as ray_worker

        table = ray_worker.global_worker.function_actor_manager._function_execution_info
        class_names = {base.__name__ for base in cls.__mro__}
        for info in list(table.values()):
            executor = getattr(info, "function", None)
            name = getattr(executor, "name", None)
            method = getattr(executor, "method", None)
            if name not in names or method is None or getattr(method, _MARK, False):
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class CrashSummary:
    """One line of ``raysleuth crashes``: a capsule, without its frames and environment."""

    id: int
    time: float
    rank: int | None
    node_ip: str | None
    hostname: str | None
    pid: int | None
    actor: str | None
    method: str | None
    exception_type: str
    message: str
    cause: str | None
    """Title of the root cause ``explain`` found, if any."""

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        return dataclasses.asdict(self)


def _first_line(text: str, limit: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def list_crashes(run: str | None = None, *, home: Any = None, rank: int | None = None,
                 limit: int | None = None) -> list[CrashSummary]:
    """The crash capsules of a run (default: the latest), oldest first. Reads the store only."""
    from raysleuth.recorder import open_store

    store = open_store(run, home=home)
    try:
        records = store.query("crash", rank=rank, limit=limit, newest_first=limit is not None)
    finally:
        store.close()
    if limit is not None:
        records.reverse()
    summaries = []
    for record in records:
        data = record.data or {}
        explanations = data.get("explanations") or []
        summaries.append(CrashSummary(
            id=record.id, time=record.time, rank=record.rank, node_ip=record.node_ip or data.get("node_ip"),
            hostname=record.hostname or data.get("hostname"), pid=record.pid or data.get("pid"),
            actor=data.get("actor_name") or data.get("actor_class") or record.actor_class,
            method=data.get("method"), exception_type=str(data.get("exception_type", "?")),
            message=_first_line(str(data.get("message", ""))),
            cause=explanations[0]["title"] if explanations else None,
        ))
    return summaries


def get_crash(capsule_id: int, run: str | None = None, *, home: Any = None) -> dict[str, Any]:
    """One capsule in full: the record's identity columns plus the capsule (``data``)."""
    from raysleuth.errors import UsageError
    from raysleuth.recorder import open_store

    store = open_store(run, home=home)
    try:
        records = store.query("crash", after_id=int(capsule_id) - 1, limit=1)
    finally:
        store.close()
    if not records or records[0].id != int(capsule_id):
        raise UsageError(f"no crash capsule with id {capsule_id} in this run",
                         fix="list them with `raysleuth crashes` (and pass the same --run/--home)")
    return records[0].to_dict()
