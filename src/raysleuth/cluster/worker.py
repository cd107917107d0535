"""Inside a worker (zero-code setup): the private Ray hooks raysleuth.worker_setup needs.

Kept here so a Ray upgrade touches one package. Each returns a plain value
or False/None when Ray moved.
"""

from __future__ import annotations

from typing import Any

from raysleuth import ray_private

__all__ = ["current_job_id", "local_logs_dir", "on_ray_train_user_error", "wrap_worker_calls"]


def current_job_id() -> str | None:
    """The Ray job id of this process (hex), or None outside Ray."""
    try:
        import ray

        return ray.get_runtime_context().get_job_id() if ray.is_initialized() else None
    except Exception:
        return None


def wrap_worker_calls(wrap: Any) -> bool:
    """Route every task function and actor method this worker runs through ``wrap(fn, label)``, once each.

    ``wrap`` gets the user's function (for an actor method: the unbound
    function, ``__init__`` included) and ``Class.method`` / the qualified
    name, and returns a function of the same kind (sync, async, generator);
    it may return ``fn`` itself to leave it alone. Ray's built-in methods
    (``__ray_*``), private methods and class/static methods are never
    offered. Done lazily, when the worker first looks a function up, so it
    costs nothing at start-up and one set lookup per call after. Returns
    False when Ray's function manager is not where we expect it.
    """
    try:
        manager = ray_private.global_worker().function_actor_manager
        original = manager.get_execution_info
        if getattr(original, "_raysleuth_wrapped", False):
            return True
        table = ray_private.function_execution_table()
        make_executor = ray_private.actor_method_executor_maker()
    except Exception:
        return False
    seen: set = set()

    def get_execution_info(job_id, function_descriptor):
        info = original(job_id, function_descriptor)
        key = function_descriptor.function_id
        if key in seen:
            return info
        seen.add(key)
        try:
            replaced = _wrapped_execution_info(info, wrap, make_executor)
            if replaced is not info:
                table[key] = replaced
                return replaced
        except Exception:
            pass
        return info

    get_execution_info._raysleuth_wrapped = True  # type: ignore[attr-defined]
    manager.get_execution_info = get_execution_info
    return True


def _wrapped_execution_info(info: Any, wrap: Any, make_executor: Any) -> Any:
    import inspect

    function = info.function
    name = getattr(function, "name", None)
    method = getattr(function, "method", None)
    if name is not None and method is not None:  # an actor method's executor
        if name not in ("__init__", "__call__") and name.startswith("_"):
            return info
        if inspect.ismethod(method) or not inspect.isfunction(method):
            return info  # class/static methods: Ray binds them itself
        label = getattr(method, "__qualname__", name)
        wrapped = wrap(method, label)
        return info if wrapped is method else info._replace(function=make_executor(name, wrapped))
    if not inspect.isfunction(function):
        return info
    wrapped = wrap(function, getattr(function, "__qualname__", None) or getattr(function, "__name__", "task"))
    return info if wrapped is function else info._replace(function=wrapped)


def on_ray_train_user_error(callback: Any) -> bool:
    """Call ``callback(exception)`` when a Ray Train (v2) training function raises in this worker.

    Ray Train runs the user's function on its own thread and keeps the
    exception for the controller, so it never escapes a method; this hooks
    the one place that sees it, without changing what Ray Train reports.
    Returns False when Ray Train is not loaded here or has moved.
    """
    module = ray_private.ray_train_thread_runner()
    if module is None:
        return False
    original = getattr(module, "construct_user_exception_with_traceback", None)
    if original is None:
        return False
    if getattr(original, "_raysleuth_wrapped", False):
        return True

    def construct_user_exception_with_traceback(error, *args, **kwargs):
        try:
            callback(error)
        except Exception:
            pass
        return original(error, *args, **kwargs)

    construct_user_exception_with_traceback._raysleuth_wrapped = True  # type: ignore[attr-defined]
    module.construct_user_exception_with_traceback = construct_user_exception_with_traceback
    return True


def local_logs_dir() -> str | None:
    """This process's Ray session logs folder (on its node), or None when not in a Ray process."""
    try:
        node = ray_private.global_node()
        return node.get_logs_dir_path() if node is not None else None
    except Exception:
        return None
