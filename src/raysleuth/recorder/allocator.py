"""How a one-shot reading command (``report``, ``memory``, ``collectives``) asks for memory.

Such a command makes and drops arrays of tens to hundreds of MB one after another (a full-mode 1,000-rank hour's
report: 0.5 GB at its peak, 0.8 GB faulted in all). Two defaults make it pay for that memory more than once:

- glibc hands a freed array of more than 32 MB back to the kernel, and trims its heap's free top, so the next
  array faults its pages in again (and the kernel zeroes them);
- numpy asks for transparent huge pages for every array of 4 MB or more (``madvise``); where the kernel's
  ``defrag`` setting is ``madvise`` (a common default), a fault in such an array compacts memory first, a stall
  of 0.3-0.6 s of system time now and then on a busy machine.

:func:`keep_freed_memory` turns both off for this process: freed memory is kept for the next arrays (its peak
stays what it was), and pages are plain. Measured on the 1,000-rank report: 125,000 page faults instead of 205,000
(4 KiB pages both), and 0.25-0.30 s of system time in five runs against 0.27-0.80 s. Only the command line's own process does it
(:func:`raysleuth.recorder.reading.one_shot`); a process that lives on keeps its allocator as it was. Where
either knob is missing (not glibc, another numpy) nothing changes.
"""

from __future__ import annotations

import ctypes
import importlib
import sys

__all__ = ["keep_freed_memory"]

#: glibc's ``mallopt`` parameters: an allocation below this many bytes comes from the heap (not its own ``mmap``),
#: and the heap's free top is kept up to this many bytes (a C ``int``: at most 2**31 - 1).
_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD = -3, -1
MMAP_BELOW, TRIM_ABOVE = 1 << 30, (1 << 31) - 1


def keep_freed_memory() -> bool:
    """Keep what this process frees for its next allocations, and ask for no huge pages for numpy's arrays;
    True when glibc took both settings."""
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy 2's, numpy 1's
        try:
            importlib.import_module(module)._set_madvise_hugepage(False)
            break
        except Exception:  # another numpy: its default stays
            continue
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_BELOW)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_ABOVE))
