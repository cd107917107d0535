"""The hook on ``torch.distributed``'s collectives: this process's calls in a bounded ring.

The ring is a ``deque`` of :data:`RING_SIZE` entries: each call appends one
list, made whole before it is appended, and writes its end time into it when
it returns, so a call touches a few cache lines (a job's memory traffic
between two collectives leaves them cold: each line touched, and each
distinct piece of the interpreter run, costs a cache miss). What each call
always records (light mode, the default): its process group's name, its
sequence number there, the op, its start and end times (``time.time_ns``),
its state and the job's step (once the job sets one); and it counts itself
as progress when it returns. The caller's file:line and the tensors' shapes
and dtypes cost several times that (a frame object and torch's shape path),
so they are kept per call only in *detail* mode (full mode, or armed on
demand: :func:`set_detail`). In light mode a dump still names the file:line
of every call that has not returned (the one a rank waits in), read from the
caller's live stack at dump time (:func:`entries`: a running wrapper's frame
holds its entry, so no thread is recorded per call); torch's Flight
Recorder, where the job has it, gives shapes and dtypes.

The hot path builds no dict, formats no string and takes no lock: under the
GIL the append and each store are atomic. A dump copies the ring in one C
call and reads each entry's end once (:func:`raw_entries`).
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
from raysleuth.collectives import wrapper

RING_SIZE = 512
"""Wrapper records kept per process (the oldest dropped)."""

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

SLOTS = ("pg", "seq", "op", "asynchronous", "step", "detail", "start_ns", "end_ns")
"""One ring entry, a list: ``detail`` is None or (code, line, call count at that line, inputs, outputs) in
detail mode; ``end_ns`` None while the call runs, negative when it raised."""
_PG, _SEQ, _OP, _ASYNC, _STEP, _DETAIL, _START, _END = range(len(SLOTS))
_ring: collections.deque[list] = collections.deque(maxlen=RING_SIZE)
"""The newest calls, oldest first (appended as they start)."""
_progress = [0]
"""Completed wrapped collectives (the progress hook's counter)."""
_detail = [False]
"""Detail mode: each call's file:line and shapes too (full mode, or :func:`set_detail`)."""
_sites: dict[tuple, int] = {}
"""(file, line) -> collectives issued from there (a step count for jobs that name no steps; detail mode)."""
_records: dict[str, list] = {}
"""Group name -> its record ``[name, calls issued there so far, desc]`` (the wrapper counts in it: its seq)."""
_groups: dict[int, list] = {}
"""id(process group) -> its record."""
_default_group: list = [None]
"""The default group's record once looked up (cleared when a process group is created)."""
_wrapped = False
_SKIP_DIRS: tuple[str, ...] = (os.path.dirname(os.path.abspath(__file__)),)
_c10d: Any = None
"""torch.distributed.distributed_c10d, once wrapped."""
_current_step = runtime.current_step
_wake = threading.Event()
"""Set when a process group is created: the background thread then records this rank at once."""


def set_detail(on: bool) -> None:
    """Record each call's file:line and tensor shapes from the next call on (light mode keeps neither)."""
    _detail[0] = bool(on)


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
        _default_group[0] = None  # a new default group may have come with it
        _wake.set()
        return result

    create.__raysleuth_collective__ = True  # type: ignore[attr-defined]
    return create


def _group_index(function: Callable) -> int:
    try:
        return list(inspect.signature(function).parameters).index("group")
    except Exception:
        return -1


_FIELDS = ("pg", "seq", "op", "input", "output", "state", "start_ns", "end_ns", "file", "line", "function", "step",
           "call")
"""A dumped call's keys (what :mod:`.model` and :mod:`raysleuth.stragglers.sources` read)."""


def _wrap(op: str, original: Callable) -> Callable:
    """``original`` with its calls in the ring: the bookkeeping inline, written in place (see the module doc).

    Per call in light mode: the group's name (a dict hit), its sequence number, a ring entry's
    fields, two clock reads. In detail mode also the caller's frame (one ``startswith`` unless the
    call came through torch), the site's count and torch's own shape and dtype objects. Nothing is
    formatted or resolved here (see :func:`entries`).
    """
    group_at = _group_index(original)
    input_at, output_at = OPS[op]
    namespace = {
        "_rs_hook": sys.modules[__name__], "_rs_op": op, "_rs_asynchronous": op in ("isend", "irecv"),
        "_rs_group_at": sys.maxsize if group_at < 0 else group_at, "_rs_input_at": input_at,
        "_rs_output_at": output_at, "_rs_time_ns": time.time_ns, "_rs_current_step": _current_step,
        "_rs_last_step": runtime.last_step_box, "_rs_append": _ring.append, "_rs_progress": _progress,
        "_rs_detail": _detail, "_rs_default": _default_group,
    }
    collective = functools.wraps(original)(wrapper.build(original, namespace))
    collective.__raysleuth_collective__ = True  # type: ignore[attr-defined]
    return collective


def _details(args, input_at, output_at) -> tuple | None:
    """Detail mode: (code, line, call count at that line, inputs, outputs) of this call."""
    frame = sys._getframe(2)
    if frame.f_code.co_filename.startswith(_SKIP_DIRS):
        frame = _user_frame(frame)
    if frame is not None:
        code, line = frame.f_code, frame.f_lineno
        site = (code.co_filename, line)  # not the code object: its hash is not cached
        count = _sites[site] = _sites.get(site, 0) + 1
    else:
        code = line = count = None
    inputs = _tensors(args, input_at)
    return code, line, count, inputs, inputs if input_at == output_at else _tensors(args, output_at)


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


def raw_entries() -> list[tuple[list, int | None]]:
    """(entry, end) of every entry in the ring, oldest first; each end read once (a running call may end meanwhile)."""
    for _ in range(3):
        try:
            ring = list(_ring)  # one C call under the GIL
            break
        except RuntimeError:  # the ring changed while it was copied (another thread ran in between): copy again
            ring = []
    return [(entry, entry[_END]) for entry in ring]


def _state(entry: list, end: int | None) -> str:
    if end is None:
        return "started"
    if end < 0:
        return "error"
    return "enqueued" if entry[_ASYNC] else "completed"


def entries() -> list[dict]:
    """The ring as JSON-ready dicts (:data:`_FIELDS`), oldest first.

    A call that has not returned and has no detail gets the file:line of its caller's live frame.
    """
    raw = raw_entries()
    waiting = _waiting_frames() if any(entry[_DETAIL] is None and end is None for entry, end in raw) else {}
    plain = []
    for entry, end in raw:
        detail = entry[_DETAIL]
        if detail is None and end is None and id(entry) in waiting:
            detail = (*waiting[id(entry)], None, (), ())
        code, line, count, inputs, outputs = detail or (None, None, None, (), ())
        plain.append({"pg": entry[_PG], "seq": entry[_SEQ], "op": entry[_OP], "input": _plain_tensors(inputs),
                      "output": _plain_tensors(outputs), "state": _state(entry, end), "start_ns": entry[_START],
                      "end_ns": abs(end) if end is not None else None,
                      "file": code.co_filename if code is not None else None, "line": line,
                      "function": code.co_name if code is not None else None, "step": entry[_STEP], "call": count})
    return plain


def _waiting_frames() -> dict[int, tuple]:
    """id(entry) -> (code, line) of the job's frame that called that wrapped collective, for each one still running.

    Each running wrapper's frame holds its entry (its local ``_rs_mine``), so the ring need not keep
    the calling thread: a running call is found on the live stacks (the wrapper's own frame).
    """
    found: dict[int, tuple] = {}
    try:
        for top in sys._current_frames().values():
            frame: Any = top
            while frame is not None:
                if frame.f_code.co_name == "collective" and frame.f_code.co_filename == wrapper.FILE:
                    mine, user = frame.f_locals.get("_rs_mine"), _user_frame(frame.f_back)
                    if type(mine) is list and user is not None:
                        found[id(mine)] = (user.f_code, user.f_lineno)
                frame = frame.f_back
    except Exception:
        pass
    return found


def _plain_tensors(tensors) -> list:
    return [[list(shape), str(dtype).replace("torch.", "")] for shape, dtype in tensors or []]


def _group(group) -> list:
    """The record of ``group`` (None: the default group), made at its first call; kept per name, so a group
    made again under the same name goes on counting where it was."""
    default = group is None
    if default:
        group = _c10d.GroupMember.WORLD
    known = _groups.get(id(group))
    if known is None:
        known = _records.get(name := str(getattr(group, "group_name", None) or "0"))
        if known is None:
            known = _records[name] = [name, 0, str(getattr(group, "group_desc", "") or "")]
        _groups[id(group)] = known
    if default and group is not None:
        _default_group[0] = known
    return known


def name_default_group(name: str | None) -> None:
    """Count calls to the default group under ``name`` from now on (None: look it up again at the next call)."""
    _default_group[0] = None if name is None else _records.setdefault(name, [name, 0, ""])


def _tune_skip_dirs() -> None:
    global _SKIP_DIRS
    try:
        import torch

        _SKIP_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))
    except Exception:
        pass


