"""Reading this process's memory, and the background sampler behind ``rs.memory.watch()``.

The one home of memory reading: :func:`read_sample` (this process, for
trends and capsules), :func:`current_usage` (with capacities, for
thresholds) and :func:`read_memory` (how full the node and GPU are, for the
logger's alert).

One sample is host RSS and USS (private bytes: RSS counts the pages of Ray's
shared object store that this process has mapped, USS does not) from
psutil, plus — only where torch is already imported *and* CUDA is
initialised — allocated, reserved and peak bytes summed over the devices
(with a per-device list). Reading USS parses ``/proc/<pid>/smaps_rollup``:
a few hundred microseconds (``bench/bench_memory.py``), so the sampler
costs well under 1% at 1 Hz.

The sampler is a daemon thread: it records each sample as kind ``memory``
(``source: "watch"``), keeps the last few hundred in a ring for capsules,
and feeds the threshold triggers of :mod:`raysleuth.memory.triggers`.
Nothing it does may raise into the training step.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import sys
import threading
import time
from typing import Any, Callable

from raysleuth import runtime
from raysleuth.recorder import record

__all__ = ["MemoryReading", "Sampler", "current_usage", "cuda_in_use", "read_memory", "read_sample", "sampler", "stop",
           "watch"]

log = logging.getLogger("raysleuth.memory")

#: Field names of one sample (kind ``memory``); the timeline draws these.
SAMPLE_FIELDS = ("rss_bytes", "uss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes", "cuda_peak_bytes")


def _torch_cuda():
    """torch.cuda when torch is already imported and CUDA initialised, else None (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        cuda = torch.cuda
        if cuda.is_available() and cuda.is_initialized():
            return cuda
    except Exception:
        pass
    return None


def cuda_in_use() -> bool:
    """True when this process has initialised CUDA through torch."""
    return _torch_cuda() is not None


_process = None
_process_pid: int | None = None


def _psutil_process():
    global _process, _process_pid
    if _process is None or _process_pid != os.getpid():
        import psutil

        _process, _process_pid = psutil.Process(), os.getpid()
    return _process


def _cuda_fields() -> dict[str, Any]:
    cuda = _torch_cuda()
    if cuda is None:
        return {"cuda_allocated_bytes": None, "cuda_reserved_bytes": None, "cuda_peak_bytes": None}
    devices = []
    for index in range(cuda.device_count()):
        try:
            devices.append({
                "device": index,
                "allocated_bytes": int(cuda.memory_allocated(index)),
                "reserved_bytes": int(cuda.memory_reserved(index)),
                "peak_bytes": int(cuda.max_memory_allocated(index)),
            })
        except Exception:
            continue
    return {
        "cuda_allocated_bytes": sum(d["allocated_bytes"] for d in devices),
        "cuda_reserved_bytes": sum(d["reserved_bytes"] for d in devices),
        "cuda_peak_bytes": sum(d["peak_bytes"] for d in devices),
        "cuda_devices": devices,
    }


def read_sample(*, uss: bool = True) -> dict[str, Any]:
    """One sample of this process: ``rss_bytes``, ``uss_bytes``, ``cuda_*_bytes`` (None without CUDA).

    ``uss=False`` skips the smaps read (RSS only, ~10x cheaper).
    """
    process = _psutil_process()
    sample: dict[str, Any] = {"rss_bytes": None, "uss_bytes": None}
    try:
        if uss:
            full = process.memory_full_info()
            sample["rss_bytes"], sample["uss_bytes"] = int(full.rss), int(full.uss)
        else:
            sample["rss_bytes"] = int(process.memory_info().rss)
    except Exception:
        try:
            sample["rss_bytes"] = int(process.memory_info().rss)
        except Exception:
            pass
    sample.update(_cuda_fields())
    return sample


def current_usage() -> dict[str, Any]:
    """Memory now, with capacities: the sample fields plus ``host_total_bytes`` and ``cuda_total_bytes``.

    For alerting (``DistributedLogger(alert_threshold=0.9)``): compare
    ``rss_bytes / host_total_bytes`` or ``cuda_reserved_bytes / cuda_total_bytes``.
    """
    usage = read_sample()
    try:
        import psutil

        usage["host_total_bytes"] = int(psutil.virtual_memory().total)
    except Exception:
        usage["host_total_bytes"] = None
    cuda = _torch_cuda()
    total = None
    if cuda is not None:
        try:
            total = sum(int(cuda.get_device_properties(i).total_memory) for i in range(cuda.device_count()))
        except Exception:
            total = None
    usage["cuda_total_bytes"] = total
    return usage


@dataclasses.dataclass
class MemoryReading:
    """How full this node (and this process's GPU) is, for alerts (``DistributedLogger(alert_threshold=...)``)."""

    host_used_bytes: int | None = None
    host_total_bytes: int | None = None
    gpu_used_bytes: int | None = None
    gpu_total_bytes: int | None = None
    rss_bytes: int | None = None

    def fractions(self) -> dict[str, float]:
        """Used fraction per device that reported one (``host``, ``gpu``)."""
        result = {}
        if self.host_used_bytes is not None and self.host_total_bytes:
            result["host"] = self.host_used_bytes / self.host_total_bytes
        if self.gpu_used_bytes is not None and self.gpu_total_bytes:
            result["gpu"] = self.gpu_used_bytes / self.gpu_total_bytes
        return result


def read_memory() -> MemoryReading:
    """Node memory (psutil) and, when CUDA is initialised in this process, GPU memory (never imports torch)."""
    reading = MemoryReading()
    try:
        import psutil

        virtual = psutil.virtual_memory()
        reading.host_total_bytes = int(virtual.total)
        reading.host_used_bytes = int(virtual.total - virtual.available)
        reading.rss_bytes = int(_psutil_process().memory_info().rss)
    except Exception:
        pass
    cuda = _torch_cuda()
    if cuda is not None:
        try:
            free, total = cuda.mem_get_info()
            reading.gpu_used_bytes, reading.gpu_total_bytes = int(total - free), int(total)
        except Exception:
            pass
    return reading


class Sampler:
    """A daemon thread that samples this process every ``interval`` seconds.

    Each sample is recorded as kind ``memory`` (rank, step and phase filled
    by the recorder client), kept in :attr:`recent`, and passed to every
    listener (threshold triggers). Use :func:`watch` rather than building one.
    """

    def __init__(self, interval: float = 1.0, *, record_samples: bool = True, history: int = 600) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.interval = float(interval)
        self.record_samples = record_samples
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=history)
        self.samples = 0
        self.errors = 0
        self.cpu_seconds = 0.0
        """CPU time this sampler's thread spent sampling (its own cost, for overhead figures)."""
        self.last_error: str | None = None
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        """True while the thread samples."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def start(self) -> "Sampler":
        """Start the thread (no-op when it runs)."""
        with self._lock:
            if not self.running:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="raysleuth-memory", daemon=True)
                self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sampling (waits up to ``timeout`` for the thread)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def add_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call ``listener(sample)`` after every sample (exceptions are swallowed)."""
        with self._lock:
            if listener not in self._listeners:
                self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Stop calling ``listener``."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def sample_once(self) -> dict[str, Any] | None:
        """Take, record and dispatch one sample now; never raises."""
        cpu_start = time.thread_time()
        try:
            return self._sample_once()
        finally:
            self.cpu_seconds += time.thread_time() - cpu_start

    def _sample_once(self) -> dict[str, Any] | None:
        try:
            sample = read_sample()
            sample["time"] = time.time()
            sample["step"] = runtime.current_step()
            sample["phase"] = runtime.current_phase()
            self.recent.append(sample)
            self.samples += 1
            if self.record_samples:
                data = {key: sample.get(key) for key in SAMPLE_FIELDS}
                if "cuda_devices" in sample:
                    data["cuda_devices"] = sample["cuda_devices"]
                data["source"] = "watch"
                record("memory", data, time_=sample["time"])
        except Exception as error:
            self.errors += 1
            if self.last_error is None:
                log.warning("raysleuth: memory sample failed (%s); the sampler goes on", error)
            self.last_error = repr(error)
            return None
        for listener in list(self._listeners):
            try:
                listener(sample)
            except Exception as error:
                self.errors += 1
                self.last_error = repr(error)
        return sample

    def _run(self) -> None:
        next_time = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_time += self.interval
            delay = next_time - time.monotonic()
            if delay < 0:  # fell behind (a stalled process): don't burst to catch up
                next_time, delay = time.monotonic(), 0.0
            self._stop.wait(delay)


_sampler: Sampler | None = None
_sampler_pid: int | None = None
_sampler_lock = threading.Lock()


def sampler() -> Sampler | None:
    """The running sampler of this process, or None."""
    current = _sampler
    if current is not None and _sampler_pid == os.getpid() and current.running:
        return current
    return None


def watch(interval: float = 1.0) -> Sampler:
    """Start sampling this process's memory every ``interval`` seconds (idempotent).

    A second call returns the running sampler; a shorter ``interval`` than
    the running one's takes effect (the faster rate wins). With
    ``RAYSLEUTH_MODE=off`` the sampler runs but records nothing.
    """
    global _sampler, _sampler_pid
    with _sampler_lock:
        current = sampler()
        if current is not None:
            if interval < current.interval:
                current.interval = float(interval)
            return current
        _sampler = Sampler(interval).start()
        _sampler_pid = os.getpid()
        return _sampler


def stop() -> None:
    """Stop this process's sampler (no-op when none runs)."""
    global _sampler
    with _sampler_lock:
        current, _sampler = _sampler, None
    if current is not None:
        current.stop()
