"""This process's client: created on first use, closed on every way the process ends.

- :func:`get_client` / :func:`record` / :func:`reset_client` — the process-wide client;
- ``ray.shutdown()`` in a process that records hands its evidence over first
  (bounded, :data:`~raysleuth.recorder.client.EXIT_DELIVERY_S`);
- a Ray worker's SIGTERM (a job that ends) spools, then briefly delivers,
  before Ray's own handler ends the process; atexit covers the rest.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from raysleuth import runtime
from raysleuth.recorder import spans as _spans
from raysleuth.recorder.client import RecordClient
from raysleuth.recorder.sinks import Sink, StoreSink, WriterSink, ray_sink

__all__ = ["get_client", "record", "reset_client"]

_client: RecordClient | None = None
_client_pid: int | None = None
_client_lock = threading.Lock()


def _default_sink() -> tuple[Sink, str]:
    """The sink for this process and the run it delivers to."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        # lazy: every instrument imports the recorder; cluster's State API readers load only where Ray is up
        from raysleuth import cluster

        try:
            run_id = cluster.session_name()
        except Exception:
            run_id = "local"
        _flush_before_ray_shutdown(ray)
        return ray_sink(), run_id
    # lazy: the local store (SQLite, its schema) loads only in a process outside Ray
    from raysleuth.recorder.store import open_run

    return StoreSink(open_run(runtime.settings().home, "local", take_latest=False)), "local"


def _flush_before_ray_shutdown(ray) -> None:
    """Make ``ray.shutdown()`` in this process hand over its evidence first (bounded).

    Without this a driver that records and then shuts Ray down at once loses
    what was queued: the writer is out of reach a moment later. The client is
    closed (spooled, delivered for at most EXIT_DELIVERY_S) and forgotten, so
    a later ``ray.init`` starts a client for the new run.
    """
    original = ray.shutdown
    if getattr(original, "_raysleuth_flushes", False):
        return

    def shutdown(*args: Any, **kwargs: Any):
        client = _client
        if client is not None and _client_pid == os.getpid() and isinstance(client.sink, WriterSink):
            try:
                client.close()
                client.sink.cancel(wait=1.0)
            except Exception:
                pass
            reset_client(None)
        try:
            return original(*args, **kwargs)
        finally:
            runtime.forget_identity()  # a later ray.init is another job: its records carry its own job id

    shutdown.__doc__ = original.__doc__
    shutdown.__wrapped__ = original  # type: ignore[attr-defined]
    shutdown._raysleuth_flushes = True  # type: ignore[attr-defined]
    ray.shutdown = shutdown


def _forget_client_after_fork() -> None:
    global _client, _client_pid
    _client, _client_pid = None, None  # the child makes its own (the thread did not survive the fork)
    _spans.forget_spans()


os.register_at_fork(after_in_child=_forget_client_after_fork)


#: A client made before Ray was initialized writes to the local run; once this process connects, the
#: next call replaces it with one that delivers to the cluster's run. Only such a process pays for the
#: check (a few hundred ns a call); a Ray worker's client is never provisional.
_provisional = False


def get_client() -> RecordClient:
    """This process's client (created on first use, again after a fork, and once Ray is up)."""
    client = _client
    if client is not None:
        if not _provisional or not _ray_initialized():
            return client
        _replace_provisional(client)
    with _client_lock:
        current = _client
        if current is None or _client_pid != os.getpid():
            current = _create()
        return current


def _create() -> RecordClient:
    global _client, _client_pid, _provisional
    sink, run_id = _default_sink()
    node_id = None
    if isinstance(sink, WriterSink):  # its spool goes to its node's folder, which that node's agent forwards
        try:
            node_id = runtime.whoami().node_id
        except Exception:
            node_id = None
    old = _client
    created = _client = RecordClient(sink, run_id=run_id, node_id=node_id)
    _hand_spans_over(old, created)
    _client_pid = os.getpid()
    _provisional = created.provisional = not isinstance(sink, WriterSink)
    if not _provisional:
        _save_on_sigterm()
    return created


def _hand_spans_over(old: RecordClient | None, new: RecordClient | None) -> None:
    """The process client changes: the old one stops taking waiting spans, and the new one takes those left
    waiting at once (a span asks for a drainer only when none or a batch's worth wait, so spans left behind
    would otherwise wait for the next batch's worth, or be lost at exit)."""
    if old is not None and old is not new:
        old.drains = False
    _spans.DRAINER[0] = None
    if new is not None and _spans.SPANS and not getattr(new, "_closed", False):
        new.drain_spans()


def _ray_initialized() -> bool:
    import sys

    ray = sys.modules.get("ray")
    try:
        return ray is not None and ray.is_initialized()
    except Exception:  # ray half imported
        return False


def _replace_provisional(old: RecordClient) -> None:
    """Ray came up after this process first recorded: what follows goes to the cluster's run."""
    global _client, _client_pid
    with _client_lock:
        if _client is not old:
            return
        _client, _client_pid = None, None
    try:
        old.close(timeout=1.0)  # what was recorded before stays in the local run
    except Exception:
        pass
    old.drains = False  # its waiting spans went with it; the next span hands them to the new client


#: At SIGTERM, how long a worker tries to deliver before Ray's own handler ends it.
SIGTERM_DELIVERY_S = 0.5
_sigterm_hooked = False


def _save_on_sigterm() -> None:
    """Chain a SIGTERM handler that spools (then briefly delivers) before Ray's handler runs.

    When a job ends, Ray sends its workers SIGTERM and they leave at once,
    without atexit: measured on Ray 2.60, a worker is gone a few ms after
    the signal. Python only lets the main thread set handlers; elsewhere (a
    Ray Train training thread) this is skipped and atexit is the only net.
    """
    global _sigterm_hooked
    import signal

    if _sigterm_hooked or threading.current_thread() is not threading.main_thread():
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)

        saving = threading.Event()

        def on_sigterm(signum, frame):
            # Ray sends SIGTERM twice in a row: a second one must not interrupt the first's save
            # (Ray's handler raises SystemExit wherever the main thread is), so it is ignored here
            # and the first one chains to Ray's handler when the evidence is on disk.
            if saving.is_set():
                return
            saving.set()
            client = _client
            if client is not None and _client_pid == os.getpid():
                try:
                    client.close(timeout=SIGTERM_DELIVERY_S)
                except Exception:
                    pass
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)
        _sigterm_hooked = True
    except Exception:  # not the main interpreter, or signals unavailable: atexit still runs
        pass


def reset_client(client: RecordClient | None = None) -> RecordClient | None:
    """Replace the process client (tests, or after ``ray.init``); returns the old one."""
    global _client, _client_pid, _provisional
    with _client_lock:
        old, _client = _client, client
        _client_pid = os.getpid() if client is not None else None
        _hand_spans_over(old, client)
        # a client made here before Ray was up stays provisional when put back; one made by hand stays
        _provisional = bool(getattr(client, "provisional", False))
    return old


def record(kind: str, data: Any = None, **columns: Any) -> None:
    """Queue one record of evidence in this process's client. Never raises."""
    if runtime.settings().mode == "off":
        return
    try:
        get_client().record(kind, data, **columns)
    except Exception:
        pass
