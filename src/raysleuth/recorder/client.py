"""The worker-side client: record now, deliver later, never block the caller.

``record(kind, ...)`` appends one tuple to a bounded deque (the oldest
record is dropped when it is full, and counted). A daemon thread wakes every
``interval`` seconds, or when a batch is ready, packs the buffer into
batches and hands them to a *sink*:

- :class:`WriterSink` — the run's writer actor (the normal case inside Ray);
- :class:`StoreSink` — a local :class:`EvidenceStore` (no Ray, or tests).

A batch the sink cannot take is appended to a JSON-lines spool file under
``$RAYSLEUTH_HOME/spool/<run-id>/`` (see :mod:`raysleuth.recorder.spool`) and
re-sent, oldest first, once the sink answers again. Rows carry
``(client_id, seq)``, so a batch delivered twice is stored once.
``stats.delivered`` counts only rows the sink acknowledged.

When the process ends (interpreter exit, a Ray worker told to exit when its
job ends, ``ray.shutdown()`` in a driver that imported raysleuth), what is
still queued or in flight is first written to the spool — a few
milliseconds, so a kill right after loses nothing — then a driver delivers it
for at most :data:`EXIT_DELIVERY_S` seconds (a Ray worker's core worker is gone
by then: it calls no Ray). What did not arrive stays in the spool for the
writer or node agent (which ingest abandoned spool files) or the CLI.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from raysleuth import ray_private, runtime
from raysleuth.recorder import spool, store
from raysleuth.recorder.spans import DRAINER, SPAN_FIELDS, SPANS, _lazy_data, _span_drops
from raysleuth.recorder.sinks import Sink
from raysleuth.recorder.write_ahead import ClientFiles

__all__ = ["ClientStats", "RecordClient"]

log = logging.getLogger("raysleuth.recorder")

#: Records at these levels are on disk (the write-ahead file) before ``record`` returns: a worker that
#: Ray ends without a chance to run Python (its actor killed with force when the job ends) keeps them.
URGENT_LEVELS = frozenset({"WARNING", "ERROR", "CRITICAL"})

#: At exit, how long a client tries to deliver what it spooled before leaving it to the writer/CLI.
EXIT_DELIVERY_S = float(os.environ.get("RAYSLEUTH_EXIT_DELIVERY_S", "2.0"))


@dataclass
class ClientStats:
    """What a client did with the records it was given."""

    recorded: int = 0
    delivered: int = 0
    dropped: int = 0
    spooled: int = 0
    failures: int = 0
    last_error: str | None = None


class RecordClient:
    """Buffers records and delivers them from a background thread."""

    def __init__(
        self,
        sink: Sink,
        *,
        capacity: int = 100_000,
        batch_size: int = 5_000,
        interval: float = 0.2,
        spool_dir: Path | None = None,
        run_id: str | None = None,
        node_id: str | None = None,
        spool_max_bytes: int | None = None,
    ) -> None:
        self.sink = sink
        self.capacity = capacity
        self.batch_size = batch_size
        self.interval = interval
        self.client_id = uuid.uuid4().hex[:16]
        self.stats = ClientStats()
        self._buffer: collections.deque = collections.deque(maxlen=capacity)
        self._seq = itertools.count()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._deliver_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.run_id = run_id or "local"
        self.provisional = False  # made before Ray was up: the process client then replaces it
        if spool_dir is not None:
            self.spool_path = Path(spool_dir) / f"{os.uname().nodename}-{os.getpid()}-{self.client_id}.jsonl"
        else:
            self.spool_path = spool.spool_path(runtime.settings().home, self.run_id, self.client_id, node_id)
        #: The most the spool file (and the write-ahead file) may hold; rows beyond it are dropped, counted.
        self.spool_max_bytes = spool.MAX_BYTES if spool_max_bytes is None else spool_max_bytes
        self._files = ClientFiles(self.spool_path, self.spool_max_bytes)  # write-ahead and flight files
        self._ahead = bool(getattr(sink, "CALLS_RAY", False))
        self._inflight: list | None = None
        self._last_header: dict[str, Any] | None = None
        self.drains = False
        """Whether this client takes :data:`SPANS` (the process client: see :meth:`drain_spans`)."""

    # ------------------------------------------------------------- hot path

    def record(self, kind: str, data: Any = None, *, name: str | None = None, level: str | None = None,
               step: int | None = None, phase: str | None = None, time_: float | None = None,
               rank: int | None = None) -> None:
        """Queue one record. Never blocks, never raises. ``rank`` overrides this process's rank."""
        try:
            buffer = self._buffer
            queued = len(buffer)
            if queued >= self.capacity:
                self.stats.dropped += 1
            row = (
                kind,
                time.time() if time_ is None else time_,
                runtime.get_rank() if rank is None else rank,
                runtime.current_step() if step is None else step,
                runtime.current_phase() if phase is None else phase,
                name,
                level,
                {} if data is None else data,
                next(self._seq),
            )
            if level in URGENT_LEVELS and self._files.wal.enabled:
                self._files.wal.write(row, buffer, self.header)  # queues it too, under the same lock as the file is emptied
            else:
                buffer.append(row)
            self.stats.recorded += 1
            if self._thread is None:
                self._start()
            elif queued >= self.batch_size:
                self._wake.set()
        except Exception:  # an instrument must not take the step down
            pass

    def drain_spans(self) -> None:
        """Take the spans of :data:`SPANS` from now on (the process client), starting the thread. Never raises.

        A provisional client (made before Ray was up) drains without becoming ``DRAINER[0]``, so the spans keep
        asking :func:`~raysleuth.recorder.get_client`, which replaces it once Ray is up.
        """
        try:
            self.drains = True
            if self._thread is None:
                self._start()
            if not self.provisional:
                DRAINER[0] = self
        except Exception:
            pass

    def _absorb_spans(self) -> None:
        """Move :data:`SPANS` into the buffer as rows (the rank each span saw, a sequence number each)."""
        if not self.drains:
            return
        buffer, seq, popleft = self._buffer, self._seq, SPANS.popleft
        taken = 0
        try:
            for _ in range(len(SPANS) // SPAN_FIELDS):  # whole spans only (each came in one extend)
                start, end, step, name, span_id, parent_id, attrs, thread, error, cached = (
                    popleft(), popleft(), popleft(), popleft(), popleft(), popleft(), popleft(), popleft(), popleft(),
                    popleft())
                rank = cached[0] if cached is not None and cached[0] is not None else runtime.get_rank()
                if len(buffer) >= self.capacity:
                    self.stats.dropped += 1
                buffer.append(("span", start, rank, step, name, name, None,
                               (start, end, span_id, parent_id, attrs, thread, error), next(seq)))
                taken += 1
        finally:
            self.stats.recorded += taken
            if _span_drops[0]:
                self.stats.recorded += _span_drops[0]
                self.stats.dropped += _span_drops[0]
                _span_drops[0] = 0

    def _clear_write_ahead(self, remove: bool = False) -> None:
        self._files.clear(self._buffer, remove)

    # ---------------------------------------------------------- background

    def _start(self) -> None:
        with self._deliver_lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="raysleuth-recorder", daemon=True)
            self._thread.start()
            atexit.register(self._close_at_exit)

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.interval)
            self._wake.clear()
            try:
                self._deliver_pending()
            except Exception as error:  # keep the thread alive whatever happens
                self.stats.last_error = repr(error)

    def header(self) -> dict[str, Any]:
        """The identity every batch of this process carries."""
        me = runtime.whoami()
        header = {
            "client_id": self.client_id,
            "world_size": me.world_size,
            "node_id": me.node_id,
            "node_ip": me.node_ip,
            "hostname": me.hostname,
            "pid": me.pid,
            "actor_id": me.actor_id,
            "actor_name": me.actor_name,
            "actor_class": me.actor_class,
            "role": me.role,
            "job_id": me.job_id,
        }
        self._last_header = header
        return header

    def _take_batch(self, track: bool = False) -> list:
        batch: list = []
        if track:
            self._inflight = batch  # visible to an exit while rows move out of the buffer
        buffer = self._buffer
        while buffer and len(batch) < self.batch_size:
            row = buffer.popleft()
            if type(row[7]) is tuple and row[0] in _lazy_data:  # spans: the dict is built here, not when traced
                row = (*row[:7], _lazy_data[row[0]](row[7]), row[8])
            batch.append(store.redacted_row(row))  # every row of every kind leaves through the one redactor
        return batch

    def _deliver_pending(self) -> bool:
        """Send the spool, then the buffer. True when everything was delivered."""
        with self._deliver_lock:
            self._idle.clear()
            try:
                self._absorb_spans()
                header = self.header()
                if self.spool_path.exists() and not self._deliver_spool(header):
                    # The sink is still down: keep new records in the spool too.
                    while self._buffer:
                        self._spool(header, self._take_batch())
                    return False
                while self._buffer:
                    batch = self._take_batch(track=True)  # what an exit must save if it comes now
                    ahead = self._ahead and ray_private.is_ray_worker_process()  # a driver's exit cancels first
                    if ahead:
                        self._files.flight.write_batch(batch, header)  # on disk before this thread calls into Ray
                    try:
                        self.sink.deliver(header, batch)
                        self.stats.delivered += len(batch)
                        if ahead:
                            self._files.landed()
                    except Exception as error:
                        self._failed(error)
                        self._spool(header, batch)  # the flight file keeps it too until the spool is delivered
                        while self._buffer:
                            self._spool(header, self._take_batch())
                        return False
                    finally:
                        self._inflight = None
                self._clear_write_ahead()
                return True
            finally:
                self._idle.set()

    def _failed(self, error: BaseException) -> None:
        self.stats.failures += 1
        if self.stats.last_error is None:
            log.warning("raysleuth: evidence writer unreachable (%s); spooling to %s", error, self.spool_path)
        self.stats.last_error = repr(error)

    def _spool(self, header: dict[str, Any], batch: list) -> None:
        try:
            written = spool.append(self.spool_path, header, batch, max_bytes=self.spool_max_bytes)
            self.stats.spooled += written
            self.stats.dropped += len(batch) - written  # over the spool's cap: counted in the file too
        except Exception as error:  # disk full, read-only home: count as dropped
            self.stats.dropped += len(batch)
            self.stats.last_error = repr(error)

    def _deliver_spool(self, header: dict[str, Any]) -> bool:
        """Stream the spool file to the sink in batches; True when all of it was delivered."""
        def deliver(file_header: dict[str, Any], batch: list) -> int:
            self.sink.deliver(file_header or header, batch)
            self.stats.delivered += len(batch)
            return len(batch)

        try:
            spool.deliver_file(self.spool_path, deliver, self.batch_size)
        except FileNotFoundError:
            return True  # nothing (left) to send
        except Exception as error:
            self._failed(error)
            return False  # the file stays; rows already delivered are ignored when sent again
        self.stats.last_error = None
        return True

    # -------------------------------------------------------------- control

    def nudge(self) -> None:
        """Have the background thread deliver now (an urgent record); returns at once. Never raises."""
        try:
            if self._thread is None:
                self._start()
            self._wake.set()
        except Exception:
            pass

    def flush(self, timeout: float = 10.0) -> bool:
        """Deliver everything queued now; True when all of it reached the sink."""
        deadline = time.monotonic() + timeout
        if self._thread is None and not self._buffer and not (self.drains and SPANS) and not self.spool_path.exists():
            return True
        return _within(deadline, self._deliver_pending, "raysleuth-recorder-flush")

    def _close_at_exit(self) -> None:
        """Interpreter exit. A Ray worker's core worker is gone by now (a call into it would end the process before
        the user's exit handlers): spool and hand over, for the writer or node agent. A driver delivers a while."""
        gone = ray_private.is_ray_worker_process()
        try:
            if gone and hasattr(self.sink, "cancel"):
                self.sink.cancel(0.0)  # this thread and the delivering one: no new call into Ray from here on
        except Exception:
            pass
        self.close(ray_gone=gone)

    def close(self, timeout: float | None = None, *, ray_gone: bool = False) -> bool:
        """Save what is left to the spool, deliver it for at most ``timeout`` s, stop the thread.

        Runs at interpreter exit (atexit; a Ray worker's SIGTERM ends in it too). ``ray_gone``: no call
        into Ray (hand over at once). True when everything reached the sink; else the spool file is handed
        over (renamed ``<host>-closed-<client>.jsonl``) to the writer or CLI.
        """
        if self._closed:
            return True
        self._closed = True
        self._wake.set()
        deadline = time.monotonic() + (EXIT_DELIVERY_S if timeout is None else timeout)
        try:
            try:
                header = None if ray_gone else self.header()  # gone: asking Ray who we are would end the process
            except Exception:  # Ray half torn down: the last header this client knew is as good
                header = None
            header = header or self._last_header or {"client_id": self.client_id, "pid": os.getpid()}
            pending = list(self._inflight or ()) + self._take_all()
            if pending:
                self._spool(header, pending)  # on disk first: a kill from here on loses nothing
            spool.note_drops(self.spool_path)
            if not self.spool_path.exists():
                self._clear_write_ahead(remove=True)  # everything it holds was delivered
                return True
            if ray_gone:
                self._hand_over()
                return False
            def attempt() -> bool:
                if not self._deliver_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    return False
                try:
                    return self._deliver_spool(header)
                finally:
                    self._deliver_lock.release()

            if _within(deadline, attempt, "raysleuth-recorder-exit") and not self.spool_path.exists():
                self._clear_write_ahead(remove=True)
                return True
            self._hand_over()  # the spool and the write-ahead file (duplicates are stored once)
            return False
        except Exception as error:  # never break the user's exit
            self.stats.last_error = repr(error)
            return False

    def _take_all(self) -> list:
        self._absorb_spans()
        rows = []
        while self._buffer:
            rows.extend(self._take_batch())
        return rows

    def _hand_over(self) -> None:
        """Name the spool and its files so the writer and the CLI know no live client will send them."""
        self._files.hand_over(self.client_id)


def _within(deadline: float, work: Callable[[], bool], name: str) -> bool:
    """Run ``work`` on a daemon thread and wait for it until ``deadline`` (monotonic); False if it did not finish."""
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(bool(work())), name=name, daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    return bool(result and result[0])
