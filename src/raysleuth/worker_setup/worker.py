"""Worker side of the zero-code setup: :func:`setup_worker`, Ray's ``worker_process_setup_hook``.

Ray runs it in every worker process of the job after the worker connected
and before it runs any task or actor code. It installs, each part on its own
(a part that fails is noted, the others go on, the worker runs on):

at start-up, because user code may need them at once (cheap):
    - the fatal-signal file (:mod:`.fatal`);
    - crash capsules for exceptions escaping any task function or actor
      method, ``__init__`` and async methods included (wrapped lazily, when
      the worker first looks the function up), and Ray Train training
      functions, and uncaught exceptions in the process and its threads;
    - log shipping of the root logger at the mode's level (light: WARNING+);
    - ``raysleuth.collectives.install()`` (the collective wrapper and its
      progress; torch's Flight Recorder too in full mode, before any process
      group exists);
    - the coroutine tracker of async actors (``raysleuth.coroutines.install()``: what each pending
      asyncio task awaits, read on the control thread);
    - the weight-sync check of every verl CheckpointEngine the job creates
      (``raysleuth.weights.verl.install()``: an import hook only);
    - the control thread (:mod:`raysleuth.control`).

on the control thread, ``DEFER_S`` seconds later, off the start-up path:
    - the rest of the mode (``RAYSLEUTH_MODE``): the memory sampler (light:
      every 10 s; full, or ``RAYSLEUTH_MEMORY_PROFILE``: every second),
      detailed tracing (full);
    - one ``event`` record named ``instrumented`` (level ``WARNING`` when a
      part failed, with the reasons);

and later, once this process has a rank (``RANK`` env, Ray Train, or
``torch.distributed`` after ``init_process_group``): one ``event`` named
``rank`` and ``# rank=<n>`` in the fatal-signal file.

``RAYSLEUTH_MODE=off`` makes it a no-op. It never prints and never raises.
Raysleuth's own actors (the writer, node agents) and Ray's internal ones
are left alone, except for Ray Train's hook that sees the user's error.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from typing import Any

from raysleuth import control, runtime

__all__ = ["setup_report", "setup_worker"]

#: Seconds after start-up before the slower parts run (off the worker's start-up path).
DEFER_S = 2.0

_lock = threading.Lock()
_done_pid: int | None = None
_state: dict[str, Any] = {"installed": [], "errors": [], "pending": [], "setup_ms": None, "timings_ms": {},
                          "internal": False}


def setup_report() -> dict[str, Any]:
    """What the setup installed in this process, and what failed (a copy)."""
    return {key: (value.copy() if isinstance(value, (list, dict)) else value) for key, value in _state.items()}


def _attempt(name: str, step: Any) -> None:
    started = time.perf_counter()
    try:
        result = step()
        if result is None and name in _LATE:
            _state["pending"].append(name)  # asked and not answered yet: a control tick sees the answer
        elif result is False:
            _state["errors"].append(f"{name}: not available here")
        else:
            _state["installed"].append(name)
    except Exception as error:
        _state["errors"].append(f"{name}: {type(error).__name__}: {str(error)[:200]}")
    _state["timings_ms"][name] = round((time.perf_counter() - started) * 1000, 3)


def setup_worker() -> None:
    """Instrument this Ray worker (give it to Ray as ``worker_process_setup_hook``). Never raises.

    Use: ``ray.init(runtime_env={"worker_process_setup_hook": "raysleuth.setup_worker"})``,
    ``ray job submit --runtime-env-json '{"worker_process_setup_hook": "raysleuth.setup_worker"}' -- ...``,
    or ``raysleuth run -- python train.py``.
    """
    global _done_pid
    try:
        with _lock:
            if _done_pid == os.getpid():
                return
            _done_pid = os.getpid()
        if runtime.settings().mode != "off":
            started = time.perf_counter()
            _attempt("fatal_signal_file", _install_fatal_file)
            _attempt("crash_capture", _install_crash_capture)
            _attempt("excepthooks", _install_excepthooks)
            _attempt("log_shipping", _ship_logs)
            _attempt("collectives", _install_collectives)
            _attempt("coroutines", _install_coroutines)
            _attempt("weight_sync", _install_weight_sync)
            _state["started"] = time.monotonic()
            _state["setup_ms"] = round((time.perf_counter() - started) * 1000, 3)
            control.on_tick(_deferred_setup)
            control.on_tick(_watch_rank)
            _state["installed"].append("control")
    except BaseException:  # Ray ends a worker whose hook raises: never let that happen
        pass
    _run_user_hook()


def _run_user_hook() -> None:
    """The job's own ``worker_process_setup_hook`` (a module path), when raysleuth took its place."""
    path = os.environ.get("RAYSLEUTH_USER_SETUP_HOOK")
    if path:
        module, _, name = path.rpartition(".")
        getattr(importlib.import_module(module), name)()  # the job's hook: its errors are the job's


# ------------------------------------------------------------ start-up parts

_header_rank: int | None = None


def _install_fatal_file() -> Any:
    from raysleuth import cluster  # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
    from raysleuth.worker_setup import fatal

    global _header_rank
    logs_dir = cluster.local_logs_dir()
    if logs_dir is None:
        return False
    _header_rank = runtime.get_rank()
    return fatal.install(logs_dir, rank=_header_rank, job_id=cluster.current_job_id())


def _install_crash_capture() -> Any:
    from raysleuth import cluster  # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)

    return cluster.wrap_worker_calls(_wrap_call)


def _install_excepthooks() -> Any:
    # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
    from raysleuth.postmortem import install_crash_capture

    install_crash_capture()


def _install_coroutines() -> Any:
    from raysleuth import coroutines  # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)

    return coroutines.install()


def _install_collectives() -> Any:
    from raysleuth import collectives  # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)

    return collectives.install()


def _install_weight_sync() -> Any:
    # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
    from raysleuth.weights import verl as verl_weights

    return verl_weights.install()  # waits for the job to import verl's CheckpointEngine; imports nothing


def _wrap_call(function: Any, label: str) -> Any:
    """Called once per task function / actor method this worker runs: wrap the user's, leave Ray's alone."""
    module = getattr(function, "__module__", None) or ""
    if module.startswith("raysleuth.") or module == "raysleuth":
        _leave_internal_actor()
        return function
    if module == "ray" or module.startswith("ray."):
        if module.startswith("ray.train"):
            # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
            from raysleuth import cluster

            cluster.on_ray_train_user_error(_ray_train_error)
        return function
    # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
    from raysleuth.postmortem.capture import capture_crashes

    return capture_crashes(function)  # labelled by __qualname__: Class.method, or the task's function


def _ray_train_error(error: BaseException) -> None:
    # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
    from raysleuth.postmortem import capture_exception

    capture_exception(error, method="train_loop_per_worker")


def _leave_internal_actor() -> None:
    """This worker is one of raysleuth's own actors: nothing of it is the job's evidence."""
    _state["internal"] = True
    try:
        # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
        from raysleuth.logs import uninstall_log_shipping

        uninstall_log_shipping()
    except Exception:
        pass
    try:
        # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
        from raysleuth.memory import stop

        stop()
    except Exception:
        pass


# ------------------------------------------------------------ background parts


def _apply_mode() -> Any:
    from raysleuth import monitoring  # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)

    settings = runtime.settings()
    explicit_level = settings.log_level if "RAYSLEUTH_LOG_LEVEL" in settings.sources else None
    monitoring.apply_mode(settings.mode, log_level=explicit_level)
    if settings.memory_profile and settings.mode != "full":
        from raysleuth import memory  # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)

        memory.watch(interval=1.0)


def _ship_logs() -> Any:
    """Ship the root logger's records at the mode's level (light: WARNING+) from the first moment."""
    from raysleuth import modes  # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
    from raysleuth.logs import install_log_shipping

    settings = runtime.settings()
    if "RAYSLEUTH_LOG_LEVEL" not in settings.sources:
        level = modes.mode_config(settings.mode).log_level
        if level and level != settings.log_level:
            runtime.reload_settings(log_level=level)
    return install_log_shipping()


def _start_death_watch() -> bool | None:
    """The writer watches Ray's dead actors while the cluster lives (deaths outlive the job: issue 29)."""
    # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
    from raysleuth.deaths.watch import start_death_watch

    return start_death_watch()


def _death_watch_answer() -> bool | None:
    """Whether the writer has answered the death watch's install yet (None: not yet), without asking again."""
    # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
    from raysleuth.deaths.watch import start_death_watch

    return start_death_watch(wait=0)


#: Parts that may answer after the setup's record (None from their step: asked, no answer yet), each with how a
#: control tick looks for its answer; and how long it looks before it says the part failed.
_LATE = {"death_watch": _death_watch_answer}
LATE_S = 120.0


def _late_parts() -> bool:
    """Each control tick while a part is pending: once it answers, or past :data:`LATE_S`, its outcome in a
    second ``instrumented`` event (``late``; WARNING when it failed). True when none is pending."""
    for name in list(_state["pending"]):
        result = _LATE[name]()
        if result is None and time.monotonic() - _state.get("started", 0.0) < DEFER_S + LATE_S:
            continue
        _state["pending"].remove(name)
        if result:
            _state["installed"].append(name)
            errors = []
        else:
            errors = [f"{name}: " + ("no answer from raysleuth's writer" if result is None else "not available here")]
            _state["errors"].extend(errors)
        try:
            # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
            from raysleuth.recorder import record

            record("event", {"installed": [] if errors else [name], "errors": errors, "source": "worker_setup",
                             "late": True}, name="instrumented", level="WARNING" if errors else "INFO")
        except Exception:
            pass
    return not _state["pending"]


def _deferred_setup() -> bool:
    """First control tick: the slower parts, then one record saying what this worker has."""
    if _state["internal"]:
        return True
    if time.monotonic() - _state.get("started", 0.0) < DEFER_S:
        return False  # let the worker take its first task first: these imports would compete for the GIL
    _attempt("mode", _apply_mode)
    if _state["internal"]:  # became one of raysleuth's actors meanwhile
        _leave_internal_actor()
        return True
    _attempt("death_watch", _start_death_watch)
    if _state["pending"]:
        control.on_tick(_late_parts)
    try:
        # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
        from raysleuth.recorder import record

        errors = list(_state["errors"])
        record("event", {"installed": list(_state["installed"]), "errors": errors, "source": "worker_setup",
                         "pending": list(_state["pending"]),
                         "setup_ms": _state["setup_ms"], "timings_ms": dict(_state["timings_ms"]),
                         "mode": runtime.settings().mode},
               name="instrumented", level="WARNING" if errors else "INFO")
        # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
        from raysleuth.recorder import get_client

        get_client().flush(timeout=10)
    except Exception:
        pass
    return True


def _watch_rank() -> bool:
    """Each control tick until this process has a rank: then say so once (store and fatal file)."""
    if _state["internal"]:
        return True
    rank = runtime.get_rank(fresh=True)
    if rank is None:
        return False
    try:
        # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
        from raysleuth.worker_setup import fatal

        if rank != _header_rank:
            fatal.note_rank(rank)
        me = runtime.whoami(refresh=True)
        # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
        from raysleuth.recorder import record

        record("event", {"rank": rank, "world_size": me.world_size, "rank_source": me.rank_source},
               name="rank", rank=rank)
        # lazy: a part of the zero-code setup, loaded when it installs (worker start-up)
        from raysleuth.recorder import get_client

        get_client().flush(timeout=10)  # on the control thread: a rank killed soon after is still labelled
    except Exception:
        pass
    return True
