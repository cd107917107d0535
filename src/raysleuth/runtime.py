"""Who am I, and how should the instruments behave here?

Two things live here, both read from the environment in one place:

- :class:`Settings` — the debug/monitoring configuration (``RAYSLEUTH_*``
  variables and the seed aliases ``VERL_DEBUG``, ``VERL_LOG_LEVEL``,
  ``VERL_MEMORY_PROFILE``, ``VERL_DEBUG_LOG``, ``RAY_DEBUG_POST_MORTEM``).
  ``Settings.from_env(env)`` takes an explicit mapping for tests.
- :class:`Identity` — the rank, node, pid, actor and task of this process.
  Ranks come from, in order: :func:`set_rank`, the ``RANK``/``WORLD_SIZE``
  environment, Ray Train's context, ``torch.distributed``; else ``None``.

Nothing here imports Ray or torch at module import time: the instruments
call :func:`get_rank` on hot paths, so it is a cached attribute read.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import socket
import sys
import threading
import time
import collections.abc
from pathlib import Path

from raysleuth.modes import MODES, read_mode
from raysleuth.ray_private import actor_class_name

__all__ = [
    "ENV_ALIASES",
    "Identity",
    "MODES",
    "Settings",
    "current_phase",
    "current_step",
    "get_rank",
    "get_world_size",
    "reload_settings",
    "set_phase",
    "set_rank",
    "set_step",
    "settings",
    "whoami",
]

#: Each raysleuth variable and the older names (from the seed articles) read
#: as its aliases. The first one set, in this order, wins.
ENV_ALIASES: dict[str, tuple[str, ...]] = {
    "RAYSLEUTH_DEBUG": ("VERL_DEBUG",),
    "RAYSLEUTH_MODE": (),
    "RAYSLEUTH_POST_MORTEM": ("RAY_DEBUG_POST_MORTEM",),
    "RAYSLEUTH_HOME": (),
    "RAYSLEUTH_LOG_LEVEL": ("VERL_LOG_LEVEL",),
    "RAYSLEUTH_LOG_FILE": ("VERL_DEBUG_LOG",),
    "RAYSLEUTH_MEMORY_PROFILE": ("VERL_MEMORY_PROFILE",),
    "RAYSLEUTH_DEBUGGER": (),
    "RAYSLEUTH_DEBUG_WAIT": (),
    "RAYSLEUTH_DEBUG_HOST": (),
    "RAYSLEUTH_RETAIN": (),
}

_TRUE = {"1", "true", "yes", "on"}


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """The instruments' configuration, as read from the environment."""

    debug: bool = False
    """Breakpoints are armed (``RAYSLEUTH_DEBUG=1``, alias ``VERL_DEBUG``)."""
    mode: str = "light"
    """``off`` (every instrument a no-op), ``light`` (cheap, always-on) or ``full``: :mod:`raysleuth.modes`."""
    post_mortem: bool = False
    """Open a breakpoint session at the frame of an unhandled crash."""
    home: Path = Path.home() / ".raysleuth"
    """Where runs, spools and reports live (``RAYSLEUTH_HOME``)."""
    log_level: str = "INFO"
    """Lowest level shipped to the evidence store (``RAYSLEUTH_LOG_LEVEL``)."""
    log_file: str | None = None
    """Also write rank-tagged log lines to this file (``VERL_DEBUG_LOG``)."""
    memory_profile: bool = False
    """Start the memory sampler in every instrumented worker."""
    debugger: str = "debugpy"
    """Breakpoint server kind: ``debugpy`` or ``pdb``."""
    debug_wait: float = 600.0
    """Seconds a breakpoint waits for a client before the worker runs on."""
    debug_host: str = "127.0.0.1"
    """Interface debug servers listen on. Never 0.0.0.0 unless asked."""
    retain: str | None = None
    """How much evidence ``raysleuth gc`` keeps: an age (``7d``), a size (``20GB``) or both (``7d,20GB``)."""
    sources: collections.abc.Mapping[str, str] = dataclasses.field(default_factory=dict)
    """For each ``RAYSLEUTH_*`` name that was set: the variable that won."""
    warnings: tuple[str, ...] = ()
    """Values that were set but invalid, and what was used instead."""

    @classmethod
    def from_env(cls, env: collections.abc.Mapping[str, str] | None = None) -> "Settings":
        """Read the settings from ``env`` (default: ``os.environ``)."""
        env = os.environ if env is None else env
        values: dict[str, str] = {}
        sources: dict[str, str] = {}
        for name, aliases in ENV_ALIASES.items():
            for candidate in (name, *aliases):
                if env.get(candidate, "") != "":
                    values[name] = env[candidate]
                    sources[name] = candidate
                    break
        mode, mode_warning = read_mode(values.get("RAYSLEUTH_MODE"))
        warnings: list[str] = [mode_warning] if mode_warning else []
        level = values.get("RAYSLEUTH_LOG_LEVEL", "INFO").strip().upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            warnings.append(f"RAYSLEUTH_LOG_LEVEL={level!r} is not a logging level; using INFO")
            level = "INFO"
        debugger = values.get("RAYSLEUTH_DEBUGGER", "debugpy").strip().lower()
        if debugger not in {"debugpy", "pdb"}:
            warnings.append(f"RAYSLEUTH_DEBUGGER={debugger!r} is not debugpy or pdb; using debugpy")
            debugger = "debugpy"
        try:
            wait = float(values.get("RAYSLEUTH_DEBUG_WAIT", "600"))
        except ValueError:
            warnings.append("RAYSLEUTH_DEBUG_WAIT is not a number of seconds; using 600")
            wait = 600.0
        home = Path(values["RAYSLEUTH_HOME"]).expanduser() if "RAYSLEUTH_HOME" in values else Path.home() / ".raysleuth"
        memory = values.get("RAYSLEUTH_MEMORY_PROFILE")
        return cls(
            debug=_truthy(values.get("RAYSLEUTH_DEBUG")),
            mode=mode,
            post_mortem=_truthy(values.get("RAYSLEUTH_POST_MORTEM")),
            home=home,
            log_level=level,
            log_file=values.get("RAYSLEUTH_LOG_FILE"),
            memory_profile=_truthy(memory) or mode == "full",
            debugger=debugger,
            debug_wait=wait,
            debug_host=values.get("RAYSLEUTH_DEBUG_HOST", "127.0.0.1"), retain=values.get("RAYSLEUTH_RETAIN"),
            sources=sources,
            warnings=tuple(warnings),
        )


_settings: Settings | None = None


def settings() -> Settings:
    """The settings of this process (read once, see :func:`reload_settings`)."""
    global _settings
    if _settings is None:
        _settings = Settings.from_env()
    return _settings


def reload_settings(env: collections.abc.Mapping[str, str] | None = None, **overrides) -> Settings:
    """Re-read the environment (or ``env``), apply ``overrides``, and use the result."""
    global _settings
    new = Settings.from_env(env)
    if overrides:
        new = dataclasses.replace(new, **overrides)
    _settings = new
    return new


# --------------------------------------------------------------------- rank

_explicit_rank: tuple[int, int | None] | None = None
_rank_cache: tuple[int | None, int | None, str] | None = None
_rank_lock = threading.Lock()


def set_rank(rank: int, world_size: int | None = None) -> None:
    """Declare this process's training rank (wins over every other source)."""
    global _explicit_rank, _rank_cache, _identity
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    _explicit_rank = (rank, world_size)
    _rank_cache = None
    _identity = None


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _imported(name: str):
    """``sys.modules[name]`` once fully imported, else None.

    Another thread may be importing it right now (a Ray worker unpickling a
    Ray Train class while a background thread asks for the rank): calling
    into a half-initialised package from here can start a second, circular
    import in this thread and break the other thread's import.
    """
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def _discover_rank() -> tuple[int | None, int | None, str]:
    if _explicit_rank is not None:
        return _explicit_rank[0], _explicit_rank[1], "set_rank"
    rank = _env_int("RANK")
    if rank is not None:
        return rank, _env_int("WORLD_SIZE"), "env"
    train = _imported("ray.train")
    if train is not None:
        try:
            context = train.get_context()
            return context.get_world_rank(), context.get_world_size(), "ray.train"
        except Exception:
            pass
    distributed = _imported("torch.distributed")
    if distributed is not None:
        try:
            if distributed.is_available() and distributed.is_initialized():
                return distributed.get_rank(), distributed.get_world_size(), "torch.distributed"
        except Exception:
            pass
    return None, None, "none"


_RANK_RECHECK_S = 1.0
_rank_checked_at = 0.0


def _rank_info() -> tuple[int | None, int | None, str]:
    global _rank_cache, _rank_checked_at
    cached = _rank_cache
    if cached is None or (cached[0] is None and time.monotonic() - _rank_checked_at >= _RANK_RECHECK_S):
        # An unknown rank is looked up again (torch.distributed may come up later),
        # at most once a second: instruments ask on every record.
        cached = _discover_rank()
        _rank_cache = cached
        _rank_checked_at = time.monotonic()
    return cached


def _forget_unknown_rank() -> None:
    global _rank_checked_at
    _rank_checked_at = 0.0


def get_rank(*, fresh: bool = False) -> int | None:
    """This process's rank, or ``None`` (a cached read; unknown is looked up ≤1/s, ``fresh``: now)."""
    if fresh:
        _forget_unknown_rank()
    cached = _rank_cache
    if cached is not None and (cached[0] is not None or time.monotonic() - _rank_checked_at < _RANK_RECHECK_S):
        return cached[0]
    return _rank_info()[0]


def get_world_size() -> int | None:
    """The world size that came with the rank, when known."""
    return _rank_info()[1]


# ------------------------------------------------------------ step and phase

_step: contextvars.ContextVar[int | None] = contextvars.ContextVar("raysleuth_step", default=None)
_phase: contextvars.ContextVar = contextvars.ContextVar("raysleuth_phase", default=None)
"""The innermost scope: an open ``rs.span`` (one variable: setting one is most of a span's cost), a set_phase's
``_Phase`` or None; each has ``name`` (the phase) and ``span_id`` (the parent of spans opened inside)."""
_Phase = collections.namedtuple("_Phase", "name span_id")
last_step_box: list[int | None] = [None]  # the last step set (a list item: what the collectives' wrapper reads)


def set_step(step: int | None) -> contextvars.Token:
    """Set the current training step (used to tag records); returns a reset token."""
    last_step_box[0] = step
    return _step.set(step)


def current_step() -> int | None:
    """The current step: this context's, else the last one set in the process."""
    step = _step.get()
    return step if step is not None else last_step_box[0]


def set_phase(phase: str | None) -> contextvars.Token:
    """Set the current phase (the innermost span's name); spans opened inside stay children of the open one."""
    return _phase.set(_Phase(phase, getattr(_phase.get(), "span_id", None)))


def current_phase() -> str | None:
    """The current phase, or ``None``."""
    return getattr(_phase.get(), "name", None)


# ----------------------------------------------------------------- identity


@dataclasses.dataclass(frozen=True, kw_only=True)
class Identity:
    """Who this process is, in the vocabulary of raysleuth."""

    rank: int | None
    world_size: int | None
    local_rank: int | None
    rank_source: str
    pid: int
    hostname: str
    node_id: str | None = None
    node_ip: str | None = None
    job_id: str | None = None
    worker_id: str | None = None
    actor_id: str | None = None
    actor_name: str | None = None
    actor_class: str | None = None
    role: str = "process"
    """``driver``, ``actor``, ``task`` or ``process`` (no Ray)."""

    def to_dict(self) -> dict:
        """The identity as a plain dict (JSON-serialisable)."""
        return dataclasses.asdict(self)


_identity: Identity | None = None
_identity_pid: int | None = None


def forget_identity() -> None:
    """Drop the cached identity (after ``ray.shutdown()``: the next ``ray.init`` is another job)."""
    global _identity
    _identity = None


def _actor_class_name(context) -> str | None:
    try:
        return actor_class_name(context.current_actor)
    except Exception:
        return None


def _became_actor(ray) -> bool:
    """A worker that was not an actor when last asked may have become one since (a 2 us check)."""
    if _identity is None or _identity.role != "task":
        return False
    try:
        return bool(ray.get_runtime_context().get_actor_id())
    except Exception:
        return False


def whoami(refresh: bool = False) -> Identity:
    """This process's identity (cached; rank looked up again until known)."""
    global _identity, _identity_pid
    pid = os.getpid()
    if not refresh and _identity is not None and _identity_pid == pid:
        ray = sys.modules.get("ray")
        ray_known = _identity.node_id is not None or ray is None or not ray.is_initialized()
        if ray_known and (_identity.rank is not None or get_rank() is None) and not _became_actor(ray):
            return _identity
    if refresh and _rank_cache is not None and _rank_cache[0] is None:
        _forget_unknown_rank()  # asked to refresh: look again now (torch.distributed may be up)
    rank, world, source = _rank_info()
    fields: dict = {}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        try:
            context = ray.get_runtime_context()
            worker_mode = context.worker.mode
            actor_id = context.get_actor_id()
            fields.update(
                node_id=context.get_node_id(),
                job_id=context.get_job_id(),
                worker_id=context.get_worker_id(),
                actor_id=actor_id,
            )
            if actor_id:
                fields.update(role="actor", actor_name=context.get_actor_name() or None,
                              actor_class=_actor_class_name(context))
            elif worker_mode == 0:  # ray.SCRIPT_MODE
                fields.update(role="driver")
            else:
                fields.update(role="task")
            fields["node_ip"] = ray.util.get_node_ip_address()
        except Exception:
            pass
    identity = Identity(
        rank=rank,
        world_size=world,
        local_rank=_env_int("LOCAL_RANK"),
        rank_source=source,
        pid=pid,
        hostname=socket.gethostname(),
        **fields,
    )
    _identity, _identity_pid = identity, pid
    return identity
