"""Peak-measured blocks: ``with MemoryBufferManager(budget_bytes=...)``.

It frees cached memory first, measures the peak inside the block, records
it, and warns past the budget.
"""

from __future__ import annotations

import gc
import logging
import threading

from raysleuth import runtime
from raysleuth.memory.sampling import _torch_cuda, read_sample
from raysleuth.recorder import record

__all__ = ["MemoryBufferManager"]

log = logging.getLogger("raysleuth.memory")


def _read_hwm() -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _trim_heap() -> None:
    """Hand the allocator's free heap back to the system (glibc ``malloc_trim``): without it, a block that
    allocates what earlier code freed reuses resident pages and its peak does not show in RSS."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark (Linux ``clear_refs`` 5); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


class MemoryBufferManager:
    """Context manager: free cached memory, measure the block's peak, record it, warn past a budget.

    Host peak: the kernel's peak-RSS mark, reset on entry (Linux), else a
    5 ms polling thread. CUDA peak: ``torch.cuda.max_memory_allocated``
    after ``reset_peak_memory_stats``. After the block: :attr:`peak_bytes`,
    :attr:`peak_increase_bytes`, :attr:`over_budget`; one ``memory`` record
    (``source: "block"``, ``name``).
    """

    def __init__(self, budget_bytes: float | None = None, *, name: str = "block", free_cache: bool = True) -> None:
        self.budget_bytes = budget_bytes
        self.name = name
        self.free_cache = free_cache
        self.metric = "rss_bytes"
        self.start_bytes: int | None = None
        self.peak_bytes: int | None = None
        self.end_bytes: int | None = None
        self.over_budget = False
        self._poll_peak = 0
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._hwm = False

    @property
    def peak_increase_bytes(self) -> int | None:
        """Peak inside the block minus the level on entry."""
        if self.peak_bytes is None or self.start_bytes is None:
            return None
        return self.peak_bytes - self.start_bytes

    def _now(self) -> int | None:
        cuda = _torch_cuda()
        if cuda is not None:
            return sum(int(cuda.memory_allocated(i)) for i in range(cuda.device_count()))
        return read_sample(uss=False)["rss_bytes"]

    def _poll(self) -> None:
        stop = self._stop
        assert stop is not None  # set before the thread starts
        while not stop.wait(0.005):
            value = self._now() or 0
            self._poll_peak = max(self._poll_peak, value)

    def __enter__(self) -> "MemoryBufferManager":
        try:
            if self.free_cache:
                gc.collect()
                _trim_heap()
            cuda = _torch_cuda()
            if cuda is not None:
                self.metric = "cuda_allocated_bytes"
                if self.free_cache:
                    cuda.empty_cache()
                for i in range(cuda.device_count()):
                    cuda.reset_peak_memory_stats(i)
            self.start_bytes = self._now()
            if cuda is None:
                self._hwm = _reset_hwm() and _read_hwm() is not None
                if not self._hwm:
                    self._poll_peak = self.start_bytes or 0
                    self._stop = threading.Event()
                    self._thread = threading.Thread(target=self._poll, name="raysleuth-memory-block", daemon=True)
                    self._thread.start()
        except Exception as error:
            log.warning("raysleuth: MemoryBufferManager could not start measuring: %r", error)
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            self.end_bytes = self._now()
            cuda = _torch_cuda()
            if cuda is not None:
                self.peak_bytes = sum(int(cuda.max_memory_allocated(i)) for i in range(cuda.device_count()))
            elif self._hwm:
                self.peak_bytes = _read_hwm()
            elif self._stop is not None:
                self._stop.set()
                if self._thread is not None:
                    self._thread.join(1.0)
                self.peak_bytes = max(self._poll_peak, self.end_bytes or 0)
            self.over_budget = bool(self.budget_bytes is not None and self.peak_bytes is not None
                                    and self.peak_bytes > self.budget_bytes)
            record("memory", {"source": "block", "metric": self.metric, "start_bytes": self.start_bytes,
                              "peak_bytes": self.peak_bytes, "end_bytes": self.end_bytes,
                              "budget_bytes": self.budget_bytes, "over_budget": self.over_budget},
                   name=self.name, level="WARNING" if self.over_budget else None)
            if self.over_budget:
                log.warning("raysleuth: %s peaked at %.1f MiB, over its budget of %.1f MiB (rank %s)",
                            self.name, (self.peak_bytes or 0) / 2**20, (self.budget_bytes or 0) / 2**20,
                            runtime.get_rank())
        except Exception as error:
            log.warning("raysleuth: MemoryBufferManager could not finish measuring: %r", error)
