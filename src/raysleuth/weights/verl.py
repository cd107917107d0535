"""verl's weight sync, checked with no change to the job: every CheckpointEngine the job creates.

verl moves weights from the trainer to the rollout workers through a
``CheckpointEngine`` (``verl/checkpoint_engine/base.py``): the trainer awaits
``engine.send_weights(weights, global_steps=)``, the rollout side iterates
``engine.receive_weights(global_steps=)`` (an async generator for the
transport backends, a plain one for the colocated ``naive`` backend). Every
engine, custom backends included, is made by ``CheckpointEngineRegistry.new``.

:func:`install` (run by the zero-code worker setup, so every worker of a job
under ``raysleuth run`` has it) wraps that one factory as soon as the job
imports ``verl.checkpoint_engine.base``, without importing verl itself. Each
engine it returns gets its ``send_weights`` / ``receive_weights`` replaced,
on the instance only, by versions that pass the weights through
:func:`raysleuth.weights.stream` (fingerprints, one ``weight_sync`` record per
side per sync, version = ``global_steps``). Nothing else changes: the
weights, the engine's class, its return values. A fingerprint that fails is
noted in the record and the sync goes on; a verl that moved its names
leaves the engine unwrapped. Engines whose ``wire_format`` is not
``named_tensors`` (delta flushes) pass through unchecked.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["MODULE", "install", "wrap_engine", "wrap_registry"]

#: The verl module that defines the registry.
MODULE = "verl.checkpoint_engine.base"
_MARK = "__raysleuth_weights__"
_installed = False


def _side(kind: str, version: Any, engine: Any):
    # lazy: installed at every worker's start-up: loads only when verl's engine is wrapped
    from raysleuth.weights.stream import SyncSide

    return SyncSide(kind, version if isinstance(version, int) and not isinstance(version, bool) else None,
                    source=f"verl:{type(engine).__name__}", strict=False)


def _checked(engine: Any) -> bool:
    return getattr(engine, "wire_format", "named_tensors") == "named_tensors"


def _checked_stream(engine: Any, stream: Any, kind: str, args: tuple, kwargs: dict) -> Any:
    """``stream`` fingerprinted on its way; unchanged when it is not a stream of named tensors (or anything fails)."""
    try:
        if not _checked(engine) or not (hasattr(stream, "__aiter__") or isinstance(stream, Iterable)) \
                or isinstance(stream, (str, bytes, dict)):
            return stream
        # lazy: installed at every worker's start-up: loads only when verl's engine is wrapped
        from raysleuth.weights.stream import pass_through

        version = kwargs.get("global_steps", args[0] if args else None)
        return pass_through(stream, _side(kind, version, engine))
    except Exception:
        return stream


def wrap_engine(engine: Any) -> Any:
    """Fingerprint this engine's syncs (idempotent; returns the engine itself)."""
    try:
        if getattr(engine, _MARK, False):
            return engine
        send, receive = getattr(engine, "send_weights", None), getattr(engine, "receive_weights", None)
        if callable(send):
            @functools.wraps(send)
            def send_weights(weights, *args, **kwargs):
                return send(_checked_stream(engine, weights, "sent", args, kwargs), *args, **kwargs)

            engine.send_weights = send_weights
        if callable(receive):
            @functools.wraps(receive)
            def receive_weights(*args, **kwargs):
                return _checked_stream(engine, receive(*args, **kwargs), "received", args, kwargs)

            engine.receive_weights = receive_weights
        setattr(engine, _MARK, True)
    except Exception:
        pass  # an engine we cannot wrap still syncs
    return engine


def wrap_registry(registry: Any) -> bool:
    """Wrap ``registry.new`` (verl's ``CheckpointEngineRegistry``) so each engine it creates is checked."""
    original = registry.__dict__.get("new")
    function = getattr(original, "__func__", None)
    if function is None or getattr(function, _MARK, False):
        return function is not None

    @functools.wraps(function)
    def new(cls, *args, **kwargs):
        return wrap_engine(function(cls, *args, **kwargs))

    setattr(new, _MARK, True)
    registry.new = classmethod(new)
    return True


def _wrap_loaded() -> bool:
    try:
        registry = getattr(sys.modules.get(MODULE), "CheckpointEngineRegistry", None)
        return registry is not None and wrap_registry(registry)
    except Exception:
        return False


def install() -> bool:
    """Check every verl weight sync of this process; cheap, never imports verl, never raises."""
    global _installed
    try:
        if _installed:
            return True
        _installed = True
        if MODULE in sys.modules:
            return _wrap_loaded()
        # lazy: installed at every worker's start-up: loads only when verl's engine is wrapped
        from raysleuth.collectives.hook import WrapOnImport

        sys.meta_path.insert(0, WrapOnImport(MODULE, _wrap_loaded))
        return True
    except Exception:
        return False
