"""The hook on ``torch.distributed``'s collectives: this process's calls in a bounded ring.

Each wrapped collective appends one entry (a list in :data:`_FIELDS` order,
holding torch's own shape and dtype objects: made plain only at dump time)
and counts itself as progress when it returns. The hot path builds no dict,
formats no string and takes no lock (a deque append is atomic).
"""

from __future__ import annotations

import collections
import functools
import importlib.abc
import inspect
import os
import sys
import threading
import time
from typing import Any, Callable

from raysleuth import runtime

RING_SIZE = 512
"""Wrapper records kept per process (oldest dropped)."""

# op -> (index of the input tensor(s), index of the output tensor(s)); None: no tensor there.
OPS: dict[str, tuple[int | None, int | None]] = {
    "all_reduce": (0, 0),
    "broadcast": (0, 0),
    "reduce": (0, 0),
    "all_gather": (1, 0),
    "all_gather_into_tensor": (1, 0),
    "reduce_scatter": (1, 0),
    "reduce_scatter_tensor": (1, 0),
    "all_to_all": (1, 0),
    "all_to_all_single": (1, 0),
    "gather": (0, 1),
    "scatter": (1, 0),
    "barrier": (None, None),
    "send": (0, None),
    "recv": (None, 0),
    "isend": (0, None),
    "irecv": (None, 0),
}

_ring: collections.deque = collections.deque(maxlen=RING_SIZE)
_progress = [0]
"""Completed wrapped collectives (the progress hook's counter)."""
_seqs: dict[str, int] = {}
_sites: dict[tuple, int] = {}
"""(file, line) -> collectives issued from there (a step count for jobs that name no steps)."""
_groups: dict[int, tuple[str, str]] = {}
_default_name: list = [None]
"""The default group's name once looked up (cleared when a process group is created)."""
_wrapped = False
_SKIP_DIRS: tuple[str, ...] = (os.path.dirname(os.path.abspath(__file__)),)
_c10d: Any = None
"""torch.distributed.distributed_c10d, once wrapped."""
_current_step = runtime.current_step
_wake = threading.Event()
"""Set when a process group is created: the background thread then records this rank at once."""


class WrapOnImport(importlib.abc.MetaPathFinder):
    """Calls ``then()`` right after the job imports module ``name`` (default: wraps ``torch.distributed``).

    Put one at the front of ``sys.meta_path``; it removes itself at the first import of ``name``.
    """

    def __init__(self, name: str = "torch.distributed", then: Callable[[], Any] | None = None) -> None:
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        try:
            sys.meta_path.remove(self)
            spec = None
            for finder in list(sys.meta_path):  # the other finders, asked directly: no import of the parent here
                find = getattr(finder, "find_spec", None)
                spec = find(name, path, target) if find is not None else None
                if spec is not None:
                    break
        except Exception:
            return None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original, then = spec.loader.exec_module, self.then or wrap_collectives

        def exec_module(module):
            original(module)
            then()

        spec.loader.exec_module = exec_module
        return spec


def wrap_collectives() -> bool:
    """Wrap ``torch.distributed``'s collectives (idempotent); False where torch.distributed is missing."""
    global _wrapped, _c10d
    try:
        import torch.distributed as dist

        if _wrapped or not dist.is_available():
            return _wrapped
        from torch.distributed import distributed_c10d as c10d

        _c10d = c10d
        _tune_skip_dirs()
        for name in ("init_process_group", "new_group"):
            original = getattr(c10d, name, None)
            if original is not None and not getattr(original, "__raysleuth_collective__", False):
                wrapped = _wake_after(original)
                setattr(c10d, name, wrapped)
                if getattr(dist, name, None) is original:
                    setattr(dist, name, wrapped)
        for op in OPS:
            original = getattr(c10d, op, None)
            if original is None or getattr(original, "__raysleuth_collective__", False):
                continue
            wrapped = _wrap(op, original)
            setattr(c10d, op, wrapped)
            if getattr(dist, op, None) is original:
                setattr(dist, op, wrapped)
        _wrapped = True
    except Exception:
        return False
    return True


def _wake_after(original: Callable) -> Callable:
    @functools.wraps(original)
    def create(*args, **kwargs):
        result = original(*args, **kwargs)
        _default_name[0] = None  # a new default group may have come with it
        _wake.set()
        return result

    create.__raysleuth_collective__ = True
    return create


def _group_index(function: Callable) -> int:
    try:
        return list(inspect.signature(function).parameters).index("group")
    except Exception:
        return -1


_FIELDS = ("pg", "seq", "op", "input", "output", "state", "start_ns", "end_ns", "code", "line", "step", "call")
_STATE, _END = _FIELDS.index("state"), _FIELDS.index("end_ns")


def _wrap(op: str, original: Callable) -> Callable:
    """``original`` with its calls in the ring: all of the bookkeeping inline, one small list per call.

    Per call: the group's name (a dict hit), its sequence number, the caller's frame (one
    ``startswith`` unless the call came through torch), the site's count, torch's own shape and
    dtype objects, two clock reads. Nothing is formatted or resolved here (see :func:`_plain`).
    """
    group_at = _group_index(original)
    if group_at < 0:
        group_at = sys.maxsize  # never a position in args
    input_at, output_at = OPS[op]
    same = input_at == output_at
    asynchronous = op in ("isend", "irecv")
    getframe, time_ns, append, current_step = sys._getframe, time.time_ns, _ring.append, _current_step

    @functools.wraps(original)
    def collective(*args, **kwargs):
        entry = None
        try:
            group = kwargs.get("group") if kwargs else None
            if group is None and group_at < len(args):
                group = args[group_at]
            name = _default_name[0] if group is None and _default_name[0] else _group_name(group)
            seq = _seqs[name] = _seqs.get(name, 0) + 1
            frame = getframe(1)
            if frame.f_code.co_filename.startswith(_SKIP_DIRS):
                frame = _user_frame(frame)
            if frame is not None:
                code, line = frame.f_code, frame.f_lineno
                site = (code.co_filename, line)  # not the code object: its hash is not cached
                count = _sites[site] = _sites.get(site, 0) + 1
            else:
                code = line = count = None
            inputs = _tensors(args, input_at)
            entry = [name, seq, op, inputs, inputs if same else _tensors(args, output_at), "started",
                     time_ns(), None, code, line, current_step(), count]
            append(entry)
        except Exception:
            entry = None
        try:
            result = original(*args, **kwargs)
        except BaseException:
            if entry is not None:
                entry[_STATE] = "error"
                entry[_END] = time_ns()
            raise
        _progress[0] += 1
        if entry is not None:
            entry[_STATE] = "enqueued" if asynchronous or kwargs.get("async_op") else "completed"
            entry[_END] = time_ns()
        return result

    collective.__raysleuth_collective__ = True
    return collective


def _user_frame(frame):
    """The first frame outside torch and raysleuth (the job's own call), or None."""
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP_DIRS):
        frame = frame.f_back
    return frame


def _tensors(args, index) -> Any:
    """(shape, dtype) of the tensor(s) at ``args[index]``: torch's own objects, made plain at dump time."""
    if index is None or index >= len(args):
        return ()
    value = args[index]
    if type(value) is list or type(value) is tuple:
        return [(item.shape, item.dtype) for item in value[:8] if hasattr(item, "shape")]
    try:
        return ((value.shape, value.dtype),)
    except AttributeError:
        return ()


def _plain(entry: list) -> dict:
    """A ring entry as JSON-ready data."""
    data = dict(zip(_FIELDS, entry))
    code = data.pop("code")
    data["file"], data["function"] = (code.co_filename, code.co_name) if code is not None else (None, None)
    for key in ("input", "output"):
        data[key] = [[list(shape), str(dtype).replace("torch.", "")] for shape, dtype in data[key] or []]
    return data


def _group_name(group) -> str:
    default = group is None
    if default:
        group = _c10d.GroupMember.WORLD
    known = _groups.get(id(group))
    if known is None:
        name = str(getattr(group, "group_name", None) or "0")
        desc = str(getattr(group, "group_desc", "") or "")
        _groups[id(group)] = known = (name, desc)
    if default and group is not None:
        _default_name[0] = known[0]
    return known[0]


def _tune_skip_dirs() -> None:
    global _SKIP_DIRS
    try:
        import torch

        _SKIP_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))
    except Exception:
        pass
