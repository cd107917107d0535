"""How full this node (and this process's GPU) is, and the alert text when it passes a threshold."""

from __future__ import annotations

import sys
from dataclasses import dataclass

__all__ = ["MemoryReading", "memory_alert", "read_memory"]


@dataclass
class MemoryReading:
    """How full this node (and this process's GPU) is."""

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
    """Node memory (psutil) and, when CUDA is initialised in this process, GPU memory."""
    reading = MemoryReading()
    try:
        import psutil

        virtual = psutil.virtual_memory()
        reading.host_total_bytes = int(virtual.total)
        reading.host_used_bytes = int(virtual.total - virtual.available)
        reading.rss_bytes = int(psutil.Process().memory_info().rss)
    except Exception:
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                free, total = torch.cuda.mem_get_info()
                reading.gpu_used_bytes, reading.gpu_total_bytes = int(total - free), int(total)
        except Exception:
            pass
    return reading


def memory_alert(fractions: dict[str, float], threshold: float) -> str | None:
    """The alert text when a device's used fraction passes ``threshold``, else ``None``."""
    over = {device: used for device, used in fractions.items() if used >= threshold}
    if not over:
        return None
    parts = ", ".join(f"{device} {used:.0%}" for device, used in sorted(over.items()))
    return f"memory above {threshold:.0%} of capacity: {parts}"
