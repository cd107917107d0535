"""The worker-side client: record now, deliver later, never block the caller.

``record(kind, ...)`` appends one tuple to a bounded deque (the oldest
record is dropped when it is full, and counted). A daemon thread wakes every
``interval`` seconds, or when a batch is ready, packs the buffer into
batches and hands them to a *sink*:

- :class:`WriterSink` — the run's writer actor (the normal case inside Ray);
- :class:`StoreSink` — a local :class:`EvidenceStore` (no Ray, or tests).

A batch the sink cannot take is appended to a JSON-lines spool file under
``$RAYSLEUTH_HOME/spool/`` and re-sent, oldest first, once the sink answers
again. Rows carry ``(client_id, seq)``, so a batch delivered twice is stored
once. ``stats.delivered`` counts only rows the sink acknowledged.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from raysleuth import runtime

__all__ = ["ClientStats", "RecordClient", "StoreSink", "WriterSink", "get_client", "record", "reset_client"]

log = logging.getLogger("raysleuth.recorder")


class Sink(Protocol):
    """Where batches go. ``deliver`` raises when the batch was not stored."""

    def deliver(self, header: dict[str, Any], rows: list) -> None: ...


class StoreSink:
    """Deliver straight into a local :class:`EvidenceStore`."""

    def __init__(self, store) -> None:
        self.store = store

    def deliver(self, header: dict[str, Any], rows: list) -> None:
        self.store.write_batch(header, rows)


class WriterSink:
    """Deliver to the run's writer actor (looked up, or created, on demand)."""

    def __init__(self, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self._handle = None

    def deliver(self, header: dict[str, Any], rows: list) -> None:
        import ray

        from raysleuth.recorder import get_writer

        if self._handle is None:
            self._handle = get_writer()
        try:
            ray.get(self._handle.write.remote(header, rows), timeout=self.timeout)
        except Exception:
            self._handle = None  # look it up again next time: it may have been replaced
            raise


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
        home = spool_dir or runtime.settings().home / "spool"
        self.spool_path = Path(home) / f"{os.uname().nodename}-{os.getpid()}-{self.client_id}.jsonl"
        self._header: dict[str, Any] | None = None

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
            buffer.append((
                kind,
                time.time() if time_ is None else time_,
                runtime.get_rank() if rank is None else rank,
                runtime.current_step() if step is None else step,
                runtime.current_phase() if phase is None else phase,
                name,
                level,
                {} if data is None else data,
                next(self._seq),
            ))
            self.stats.recorded += 1
            if self._thread is None:
                self._start()
            elif queued >= self.batch_size:
                self._wake.set()
        except Exception:  # an instrument must not take the step down
            pass

    def record_span(self, start: float, step: int | None, name: str, payload: tuple) -> None:
        """:meth:`record` for a span (the hot path of ``rs.span``). Never raises.

        ``payload`` is a tuple of plain values; the dict is built from it by
        the function registered with :func:`register_lazy_data` when the batch
        is taken, off the traced thread, and rows of plain values are not
        followed by the garbage collector while they wait.
        """
        try:
            buffer = self._buffer
            queued = len(buffer)
            if queued >= self.capacity:
                self.stats.dropped += 1
            cached = runtime._rank_cache  # a worker's rank, once known, without a call
            rank = cached[0] if cached is not None and cached[0] is not None else runtime.get_rank()
            buffer.append(("span", start, rank, step, name, name, None, payload, next(self._seq)))
            self.stats.recorded += 1
            if self._thread is None:
                self._start()
            elif queued >= self.batch_size:
                self._wake.set()
        except Exception:
            pass

    # ---------------------------------------------------------- background

    def _start(self) -> None:
        with self._deliver_lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="raysleuth-recorder", daemon=True)
            self._thread.start()
            atexit.register(self.close)

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
        }
        return header

    def _take_batch(self) -> list:
        batch = []
        buffer = self._buffer
        while buffer and len(batch) < self.batch_size:
            row = buffer.popleft()
            if type(row[7]) is tuple and row[0] in _lazy_data:  # spans: the dict is built here, not when traced
                row = (*row[:7], _lazy_data[row[0]](row[7]), row[8])
            batch.append(row)
        return batch

    def _deliver_pending(self) -> bool:
        """Send the spool, then the buffer. True when everything was delivered."""
        with self._deliver_lock:
            self._idle.clear()
            try:
                header = self.header()
                if self.spool_path.exists() and not self._deliver_spool(header):
                    # The sink is still down: keep new records in the spool too.
                    while self._buffer:
                        self._spool(header, self._take_batch())
                    return False
                while self._buffer:
                    batch = self._take_batch()
                    try:
                        self.sink.deliver(header, batch)
                        self.stats.delivered += len(batch)
                    except Exception as error:
                        self._failed(error)
                        self._spool(header, batch)
                        while self._buffer:
                            self._spool(header, self._take_batch())
                        return False
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
            self.spool_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.spool_path, "a", encoding="utf-8") as handle:
                for row in batch:
                    handle.write(json.dumps(list(row), default=repr, separators=(",", ":")) + "\n")
            self.stats.spooled += len(batch)
        except Exception as error:  # disk full, read-only home: count as dropped
            self.stats.dropped += len(batch)
            self.stats.last_error = repr(error)

    def _deliver_spool(self, header: dict[str, Any]) -> bool:
        try:
            lines = self.spool_path.read_text(encoding="utf-8").splitlines()
        except OSError:
            return True
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a torn last line from a crash: skip it
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start:start + self.batch_size]
            try:
                self.sink.deliver(header, batch)
            except Exception as error:
                self._failed(error)
                # rewrite the spool with what is left
                rest = rows[start:]
                tmp = self.spool_path.with_suffix(".tmp")
                tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rest), encoding="utf-8")
                os.replace(tmp, self.spool_path)
                return False
            self.stats.delivered += len(batch)
        self.spool_path.unlink(missing_ok=True)
        self.stats.last_error = None
        return True

    # -------------------------------------------------------------- control

    def flush(self, timeout: float = 10.0) -> bool:
        """Deliver everything queued now; True when all of it reached the sink."""
        deadline = time.monotonic() + timeout
        if self._thread is None and not self._buffer and not self.spool_path.exists():
            return True
        result: list[bool] = []

        def attempt() -> None:
            result.append(self._deliver_pending())

        worker = threading.Thread(target=attempt, daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))
        return bool(result and result[0])

    def close(self) -> None:
        """Flush what is left (bounded) and stop the thread."""
        if self._closed:
            return
        self.flush(timeout=5.0)
        self._closed = True
        self._wake.set()


_lazy_data: dict[str, Callable[[tuple], dict[str, Any]]] = {}


def register_lazy_data(kind: str, build: Callable[[tuple], dict[str, Any]]) -> None:
    """Rows of ``kind`` whose data is a plain tuple get their dict from ``build(tuple)`` when taken."""
    _lazy_data[kind] = build


_client: RecordClient | None = None
_client_pid: int | None = None
_client_lock = threading.Lock()


def _default_sink() -> Sink:
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return WriterSink()
    from raysleuth.recorder.store import open_run

    return StoreSink(open_run(runtime.settings().home, "local"))


def _forget_client_after_fork() -> None:
    global _client, _client_pid
    _client, _client_pid = None, None  # the child makes its own (the thread did not survive the fork)


os.register_at_fork(after_in_child=_forget_client_after_fork)


def get_client() -> RecordClient:
    """This process's client (created on first use, again after a fork)."""
    global _client, _client_pid
    client = _client
    if client is not None:
        return client
    with _client_lock:
        if _client is None or _client_pid != os.getpid():
            _client = RecordClient(_default_sink())
            _client_pid = os.getpid()
        return _client


def reset_client(client: RecordClient | None = None) -> RecordClient | None:
    """Replace the process client (tests, or after ``ray.init``); returns the old one."""
    global _client, _client_pid
    with _client_lock:
        old, _client = _client, client
        _client_pid = os.getpid() if client is not None else None
    return old


def record(kind: str, data: Any = None, **columns: Any) -> None:
    """Queue one record of evidence in this process's client. Never raises."""
    if runtime.settings().mode == "off":
        return
    try:
        get_client().record(kind, data, **columns)
    except Exception:
        pass
