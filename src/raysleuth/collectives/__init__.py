"""Collective forensics: which rank broke the collective sequence.

- ``install()`` (worker side, :mod:`.record`): called in a worker by the
  zero-code setup, or given to Ray directly as
  ``runtime_env={"worker_process_setup_hook": "raysleuth.collectives.install"}``.
  Switches torch's Flight Recorder on in full mode (``TORCH_FR_BUFFER_SIZE``
  unless set; light mode keeps only the wrapper, see
  :func:`.record.flight_recorder_wanted`), wraps the ``torch.distributed``
  collectives when the job imports them
  (user frame, step, progress heartbeats), answers dump requests from the
  control thread. Never raises; a no-op without torch.
- ``dump(reason)``: writes this process's collective records to the store.
- :func:`collective_culprits` (:mod:`.matcher`, pure): the ranks that broke
  the sequence, from ``collectives`` records; the stacks verdict's
  "collective positions" rule.
- :func:`collect_collectives` (:mod:`.report`): ask live workers for a dump,
  read the store, match; works on a stored run after the cluster is gone.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CollectivesReport", "collect_collectives", "collective_culprits", "dump", "install", "match"]


def install() -> None:
    """Prepare collective recording in this worker (usable as Ray's worker_process_setup_hook); never raises."""
    try:
        # lazy: the face the setup hook imports in every worker: each part loads when called
        from raysleuth.collectives.record import install as _install

        _install()
    except Exception:
        pass


def dump(reason: str = "request") -> dict[str, Any] | None:
    """Write this process's collective records to the evidence store; returns what was written."""
    try:
        # lazy: the face the setup hook imports in every worker: each part loads when called
        from raysleuth.collectives.record import dump as _dump

        return _dump(reason)
    except Exception:
        return None


def __getattr__(name: str) -> Any:
    if name in ("collective_culprits", "match"):
        # lazy: the face the setup hook imports in every worker: each part loads when called
        from raysleuth.collectives import matcher

        return getattr(matcher, name)
    if name in ("CollectivesReport", "collect_collectives"):
        # lazy: the face the setup hook imports in every worker: each part loads when called
        from raysleuth.collectives import report

        return getattr(report, name)
    raise AttributeError(name)
