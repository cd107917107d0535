"""Top holders: which containers of the program hold the big buffers.

The walk starts from what the program can reach — the locals of every
thread's frames, then module globals (``__main__`` and user modules first)
— through lists, tuples, dicts, sets, deques and instances of Python
classes, sums the big buffers (bytes, bytearray, numpy arrays, torch
tensors) each container holds directly, and names the owner from the path
(``Leaker.buffers``, ``module.CACHE``, ``train() local held``), within a
time and object budget. It never scans the collector's whole heap: objects
there may be half built by another thread (a tuple still being filled), and
holding or iterating one crashes the process or breaks that thread. Every
container is read as one snapshot taken under the GIL (``list(d.items())``,
``gc.get_referents``), and no attribute of a foreign object is read
through its own ``__getattribute__`` (torch.distributed's deprecated
``reduce_op`` warns when touched).
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import threading
import time
import types
from typing import Any

__all__ = ["top_holders"]

_OWN_DIR = os.path.dirname(os.path.abspath(__file__))


def _buffer_bytes(obj: Any) -> tuple[int, str | None]:
    """Bytes a big buffer object owns, and where ('cpu', 'cuda:0'); (0, None) for other objects."""
    kind = type(obj)
    if kind is bytes or kind is bytearray:
        return len(obj), "cpu"
    if kind.__name__ == "ndarray":
        try:
            return (int(obj.nbytes), "cpu") if obj.base is None else (0, None)
        except Exception:
            return 0, None
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(kind, torch.Tensor):  # the type only: never the object's own getattr
        try:
            return int(obj.untyped_storage().nbytes()), str(obj.device)
        except Exception:
            return 0, None
    if kind is memoryview:
        try:
            return obj.nbytes, "cpu"
        except Exception:
            return 0, None
    return 0, None


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python


def _children(obj: Any) -> list[tuple[str, Any]] | None:
    """(label, child) pairs of a container or a Python-class instance, as one snapshot; None for anything else."""
    kind = type(obj)
    if issubclass(kind, dict):
        return [(f"[{key!r}]"[:60] if not isinstance(key, str) else f"[{key!r}]", value)
                for key, value in list(dict.items(obj))]
    if kind in (list, tuple, set, frozenset, collections.deque):
        return [(f"[{index}]", value) for index, value in enumerate(gc.get_referents(obj))]
    if kind.__flags__ & _HEAPTYPE and not issubclass(kind, type):
        try:
            attributes = object.__getattribute__(obj, "__dict__")
        except Exception:
            return None
        if type(attributes) is dict:
            return [(f".{key}", value) for key, value in list(attributes.items())]
    return None


def _roots() -> list[tuple[str, Any]]:
    """Where the walk starts: every thread's frame locals, then module globals (the program's first)."""
    roots: list[tuple[str, Any]] = []
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, top in sys._current_frames().items():
        frame: types.FrameType | None = top
        while frame is not None:
            code = frame.f_code
            if not code.co_filename.startswith(_OWN_DIR):
                try:
                    local_items = list(frame.f_locals.items())
                except Exception:
                    local_items = []
                where = f"{code.co_name}() local" + ("" if ident == threading.main_thread().ident
                                                      else f" (thread {names.get(ident, ident)})")
                roots += [(f"{where} {name}", value) for name, value in local_items]
            frame = frame.f_back
    modules = list(sys.modules.items())
    library = ("site-packages", "dist-packages", os.path.dirname(os.__file__))
    for first in (True, False):
        for name, module in modules:
            try:
                namespace = object.__getattribute__(module, "__dict__")
                path = str(namespace.get("__file__") or "")
            except Exception:
                continue
            is_library = (not path) or any(part in path for part in library) or name.startswith("raysleuth")
            if is_library == first or type(namespace) is not dict:
                continue
            roots += [(f"{name}.{key}", value) for key, value in list(namespace.items())]
    return roots


def top_holders(limit: int = 10, *, min_bytes: int = 1 << 20, time_budget: float = 2.0,
                max_objects: int = 500_000) -> dict[str, Any]:
    """The containers that hold the most bytes of big buffers, each named by how the program reaches it.

    Returns ``{"holders": [{"owner", "container", "bytes", "objects", "devices"}], "scanned", "partial"}``.
    """
    budget_end = time.monotonic() + time_budget
    found: list[tuple[int, int, str, str, dict[str, int]]] = []
    seen: set[int] = set()
    queue = collections.deque(_roots())
    scanned = 0
    partial = False
    while queue:
        if scanned >= max_objects or (scanned % 2048 == 0 and time.monotonic() > budget_end):
            partial = True
            break
        path, obj = queue.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            children = _children(obj)
        except Exception:
            children = None
        if not children:
            continue
        scanned += 1
        total, count, devices = 0, 0, collections.Counter[str]()
        for label, child in children:
            size, device = _buffer_bytes(child)
            if size:
                total += size
                count += 1
                devices[device or "cpu"] += size  # a sized buffer always names its device
            elif id(child) not in seen:
                owner = f"{type(obj).__name__}{label}" if label.startswith(".") else f"{path}{label}"
                queue.append((owner, child))
        if total >= min_bytes:
            found.append((total, count, path, f"{type(obj).__name__} of {len(children)}", dict(devices)))
    found.sort(key=lambda item: item[0], reverse=True)
    holders = [{"owner": owner, "container": container, "bytes": total, "objects": count, "devices": devices}
               for total, count, owner, container, devices in found[:limit]]
    return {"holders": holders, "scanned": scanned, "partial": partial}
