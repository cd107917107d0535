"""The wrapper function each collective gets: one template, made with the collective's own signature.

A wrapper ``def collective(*args, **kwargs)`` that forwards ``original(*args,
**kwargs)`` packs a tuple and a dict on every call and runs CPython's
generic argument code twice. Between a job's collectives its memory
traffic leaves the interpreter's code cold, so what a call costs is mostly
the distinct code it runs: under cachegrind (a 2 MB last-level cache, 4 MB
of traffic between calls) that wrapper ran ~8,600 instructions and missed
the instruction cache ~330 times a call, against ~5,800 and ~180 for the
same bookkeeping behind the collective's own parameters. So :func:`build`
writes the template below with the original's parameters (defaults
included) and passes them on as the original takes them; a function whose
signature has ``*args``/``**kwargs`` or cannot be read gets the forwarding
form of the same template. Both are compiled with this file's name and the
template's own lines, so a stack shows ``collective`` in this file (a
raysleuth frame, skipped when the job's own frame is looked for).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable

__all__ = ["FILE", "build"]

FILE = __file__
"""The file every wrapper's code says it comes from (what :func:`raysleuth.collectives.hook` looks for)."""

_LINE = sys._getframe().f_lineno + 2  # ``def collective`` below: the compiled code keeps this file's lines
_TEMPLATE = '''
def collective({params}):
    _rs_mine = None
    try:
        {group}
        _rs_g = _rs_default[0] if group is None and _rs_default[0] is not None else _rs_hook._group(group)
        _rs_g[1] = _rs_seq = _rs_g[1] + 1
        _rs_mine = [
            _rs_g[0], _rs_seq, _rs_op, {asynchronous},
            _rs_current_step() if _rs_last_step[0] is not None else None,  # None: no step set yet
            _rs_hook._details({args}, _rs_input_at, _rs_output_at) if _rs_detail[0] else None,
            _rs_time_ns(), None]
        _rs_append(_rs_mine)  # whole before a reader can see it
    except Exception:
        _rs_mine = None
    try:
        _rs_result = _rs_original({call})
    except BaseException:
        if _rs_mine is not None:
            _rs_mine[7] = -_rs_time_ns()  # 7: hook._END (a literal: no global to read)
        raise
    _rs_progress[0] += 1
    if _rs_mine is not None:
        _rs_mine[7] = _rs_time_ns()
    return _rs_result
'''
_FORWARDING = {
    "params": "*_rs_args, **_rs_kwargs",
    "group": "group = _rs_kwargs.get('group') if _rs_kwargs else None; group = _rs_args[_rs_group_at] "
             "if group is None and _rs_group_at < len(_rs_args) else group",
    "asynchronous": "_rs_asynchronous or bool(_rs_kwargs.get('async_op')) if _rs_kwargs else _rs_asynchronous",
    "args": "_rs_args",
    "call": "*_rs_args, **_rs_kwargs",
}
"""The template's fields for a function whose parameters are not written out: it forwards what it gets."""


def _own_signature(original: Callable) -> tuple[dict[str, str], dict[str, Any]] | None:
    """The template's fields and defaults for ``original``'s parameters; None where they cannot be written out."""
    try:
        parameters = list(inspect.signature(original).parameters.values())
    except (TypeError, ValueError):
        return None
    params: list[str] = []
    positional: list[str] = []
    keywords: list[str] = []
    defaults: dict[str, Any] = {}
    slash = star = False
    for index, parameter in enumerate(parameters):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or \
                not parameter.name.isidentifier() or parameter.name.lower().startswith("_rs_"):
            return None  # the template's own names all start with _rs_
        if parameter.kind is parameter.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        if parameter.kind is not parameter.POSITIONAL_ONLY and slash is False and index and \
                parameters[index - 1].kind is parameter.POSITIONAL_ONLY:
            params.append("/")
            slash = True
        text = parameter.name
        if parameter.default is not parameter.empty:
            defaults[f"_rs_default_{index}"] = parameter.default
            text += f"=_rs_default_{index}"
        params.append(text)
        (keywords if parameter.kind is parameter.KEYWORD_ONLY else positional).append(parameter.name)
    if parameters and parameters[-1].kind is parameters[-1].POSITIONAL_ONLY:
        params.append("/")
    names = [parameter.name for parameter in parameters]
    fields = {
        "params": ", ".join(params),
        "group": "group = group" if "group" in names else "group = None",
        "asynchronous": "_rs_asynchronous or bool(async_op)" if "async_op" in names else "_rs_asynchronous",
        "args": f"({', '.join(positional)}{',' if len(positional) == 1 else ''})",
        "call": ", ".join([*positional, *(f"{name}={name}" for name in keywords)]),
    }
    return fields, defaults


def build(original: Callable, namespace: dict[str, Any]) -> Callable:
    """The wrapper of ``original``: the template, with ``namespace`` (``_rs_`` names: the ring, the counters, the
    hook module...) as its globals; written with ``original``'s own parameters where they can be, else the
    forwarding form."""
    own = _own_signature(original)
    fields, defaults = own if own is not None else (_FORWARDING, {})
    source = "\n" * (_LINE - 2) + _TEMPLATE.format(**fields)
    scope = {**namespace, **defaults, "_rs_original": original}
    exec(compile(source, FILE, "exec"), scope)  # noqa: S102  (our own template, filled with parameter names)
    return scope["collective"]
