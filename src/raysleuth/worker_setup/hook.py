"""Driver side of the zero-code setup: put raysleuth's worker hook into the job's ``runtime_env``.

``raysleuth run`` starts the user's driver with
``RAY_RUNTIME_ENV_HOOK=raysleuth.worker_setup.runtime_env_hook``. Ray calls
that hook inside the driver's own ``ray.init`` with the ``runtime_env`` the
job asked for (merged with the one of ``ray job submit``, if any), and uses
what it returns as the job's runtime environment. Every worker of the job,
on every node, inherits it, including actors that set a ``runtime_env`` of
their own (Ray merges ``env_vars`` key by key, and the hook travels as one of
them).

:func:`add_setup_hook` is the pure merge: it never removes or changes what
the job set. A job that has its own ``worker_process_setup_hook`` keeps it:
raysleuth's runs first, then the job's. A previous ``RAY_RUNTIME_ENV_HOOK``
(given to ``raysleuth run`` in the environment) still runs, before ours.
Under ``raysleuth run`` the hook travels by value (:func:`tolerant_setup_hook`),
so a node where raysleuth is not installed runs the job uninstrumented
instead of failing every worker start.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Mapping
from typing import Any

from raysleuth.runtime import ENV_ALIASES

__all__ = [
    "ENV_HOOK",
    "PREVIOUS_ENV_HOOK",
    "SETUP_HOOK",
    "USER_SETUP_HOOK",
    "add_setup_hook",
    "forwarded_environment",
    "runtime_env_hook",
    "tolerant_setup_hook",
]

SETUP_HOOK = "raysleuth.setup_worker"
"""What to give Ray as ``worker_process_setup_hook``."""
ENV_HOOK = "raysleuth.worker_setup.runtime_env_hook"
"""What ``raysleuth run`` puts in ``RAY_RUNTIME_ENV_HOOK``."""
PREVIOUS_ENV_HOOK = "RAYSLEUTH_PREVIOUS_RUNTIME_ENV_HOOK"
"""Where ``raysleuth run`` keeps a ``RAY_RUNTIME_ENV_HOOK`` the user had set (it still runs)."""
USER_SETUP_HOOK = "RAYSLEUTH_USER_SETUP_HOOK"
"""Worker env var naming the job's own setup hook (a module path), run after raysleuth's."""


def forwarded_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The raysleuth settings of ``env`` (``RAYSLEUTH_*`` and their aliases) that workers should see."""
    names = [name for pair in ENV_ALIASES.items() for name in (pair[0], *pair[1])]
    return {name: env[name] for name in names if env.get(name, "") != ""}


def _mode(env: Mapping[str, str]) -> str:
    return (env.get("RAYSLEUTH_MODE") or "light").strip().lower()


_TOLERANT_HOOK_SOURCE = """
def raysleuth_setup_worker(job_hook=None):
    try:
        import raysleuth
    except ImportError:
        raysleuth = None  # not installed on this node: the worker runs uninstrumented
    if raysleuth is not None:
        raysleuth.setup_worker()
    if job_hook is not None:
        job_hook()
"""


def tolerant_setup_hook() -> Any:
    """A setup hook that Ray ships by value: on a node without raysleuth the worker starts uninstrumented.

    Given as a module path (``raysleuth.setup_worker``), a node that cannot
    import raysleuth fails every worker start; this function is defined in
    ``__main__``'s name so cloudpickle sends its code, not a reference.
    """
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(_TOLERANT_HOOK_SOURCE, "<raysleuth setup hook>", "exec"), namespace)  # noqa: S102 - our own code
    return namespace["raysleuth_setup_worker"]


def add_setup_hook(runtime_env: Mapping[str, Any] | None, env: Mapping[str, str], *,
                   hook: Any = SETUP_HOOK) -> dict[str, Any] | None:
    """``runtime_env`` with raysleuth's worker setup hook and settings added; the job's own values win.

    Pure. With ``RAYSLEUTH_MODE=off`` in ``env`` nothing is added (the
    input comes back as it was). ``env`` is the driver's environment;
    ``hook`` the setup to give Ray (a module path, or :func:`tolerant_setup_hook`).
    """
    if _mode(env) == "off":
        return None if runtime_env is None else dict(runtime_env)
    result: dict[str, Any] = dict(runtime_env or {})
    env_vars = dict(result.get("env_vars") or {})
    existing = result.get("worker_process_setup_hook")
    if existing is None or existing == SETUP_HOOK:
        result["worker_process_setup_hook"] = hook
    elif isinstance(existing, str):
        env_vars.setdefault(USER_SETUP_HOOK, existing)
        result["worker_process_setup_hook"] = hook
    elif callable(existing):
        result["worker_process_setup_hook"] = functools.partial(
            hook if callable(hook) else _setup_then, existing)
    for name, value in forwarded_environment(env).items():
        env_vars.setdefault(name, value)
    if env_vars:
        result["env_vars"] = env_vars
    return result


def _setup_then(user_hook: Any) -> None:
    """Worker hook when the job has a callable hook of its own: raysleuth's, then the job's."""
    # lazy: the hook module is loaded by Ray's runtime-env hook too; this part only when it runs
    from raysleuth.worker_setup.worker import setup_worker

    setup_worker()
    user_hook()


def _load(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def runtime_env_hook(runtime_env: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Ray's ``RAY_RUNTIME_ENV_HOOK``: called in the driver's ``ray.init`` with the job's runtime_env.

    A user's previous hook (``RAYSLEUTH_PREVIOUS_RUNTIME_ENV_HOOK``) runs
    first. A failure here must not stop the job: the job's runtime_env is
    returned unchanged.
    """
    previous = os.environ.get(PREVIOUS_ENV_HOOK)
    if previous and previous != ENV_HOOK:
        runtime_env = _load(previous)(runtime_env)  # the user's hook: its errors are the user's
    try:
        _look_at_deaths_on_exit()
        return add_setup_hook(runtime_env, os.environ, hook=tolerant_setup_hook())
    except Exception:
        return None if runtime_env is None else dict(runtime_env)


_looking = False


def _look_at_deaths_on_exit() -> None:
    """At the driver's exit, before Ray's shutdown: store the deaths the writer's watch has not stored yet,
    so a rank killed just before the job ended is not forgotten.

    Registered with the interpreter's *thread* exit hooks, not ``atexit``: those run first, while
    ``concurrent.futures`` still takes work (it refuses new futures once its own thread exit hook ran, and
    the look reads logs and asks node agents through thread pools). They run last-registered first, so
    ``concurrent.futures.thread`` is imported (its hook registered) before ours. ``atexit`` is the fallback
    where the interpreter has no such hooks."""
    global _looking
    if _looking or os.environ.get("RAYSLEUTH_MODE", "light") == "off":
        return
    _looking = True
    import atexit
    import concurrent.futures.thread  # noqa: F401 (registers its exit hook before ours)
    import threading

    # lazy: the hook module is loaded by Ray's runtime-env hook too; this part only when it runs
    from raysleuth.deaths.watch import last_look

    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise AttributeError("no thread exit hooks")
        register(last_look)
    except Exception:
        atexit.register(last_look)
