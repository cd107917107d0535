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

Layout: :mod:`~raysleuth.redaction` (secrets), :mod:`~raysleuth.postmortem.capsule`
(building and writing a capsule), :mod:`~raysleuth.postmortem.capture` (decorators and hooks),
:mod:`~raysleuth.postmortem.query` (reading capsules back).
"""

from raysleuth.postmortem.capsule import CrashCapsule, build_capsule, capture_exception
from raysleuth.postmortem.capture import capture_crashes, install_crash_capture, install_crash_capture_on_instance
from raysleuth.postmortem.query import CrashSummary, get_crash, list_crashes
from raysleuth.redaction import (
    REDACTED,
    looks_like_secret_name,
    looks_like_token,
    redact,
    redact_text,
    relevant_environment,
    safe_repr,
)

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
