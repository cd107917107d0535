"""What can be fingerprinted: a tensor or array reduced to a flat, contiguous, native-order byte view."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CHUNK_BYTES", "NUMERIC_KINDS", "Prepared", "import_torch", "is_torch_tensor", "named_items", "prepare"]

CHUNK_BYTES = 4 * 1024 * 1024
"""Bytes per chunk (rounded down to whole elements)."""
NUMERIC_KINDS = "biufc"


def import_torch():
    import torch

    return torch


def is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _describe(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__


def _type_error(value: Any, name: str | None, why: str | None = None) -> TypeError:
    where = f"entry {name!r}" if name is not None else "value"
    reason = why or f"got {_describe(value)}"
    return TypeError(f"cannot fingerprint {where}: {reason}; pass a torch.Tensor or numpy.ndarray")


@dataclass
class Prepared:
    """A tensor reduced to a flat, contiguous, native-order byte view."""

    data: Any  # numpy uint8 array, or torch uint8 tensor (on its device)
    dtype: str
    shape: tuple[int, ...]
    numel: int
    itemsize: int
    device: str
    framework: str
    source: Any  # the contiguous array / tensor, for statistics


def _numpy_dtype_name(dtype: np.dtype) -> str:
    if dtype.kind in NUMERIC_KINDS or dtype.kind in "mM":
        return dtype.name
    return dtype.newbyteorder("=").str if dtype.byteorder not in "|" else dtype.str


def prepare(value: Any, name: str | None = None) -> Prepared:
    if is_torch_tensor(value):
        return _prepare_torch(value, name)
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise _type_error(value, name)
    dtype = value.dtype
    if dtype.hasobject or dtype.kind in "OT":
        raise _type_error(value, name, f"numpy dtype {dtype} holds Python objects, not bytes")
    if dtype.byteorder == ">" or (dtype.byteorder == "<" and sys.byteorder == "big"):
        value = value.astype(dtype.newbyteorder("="))
    array = value if value.flags.c_contiguous else value.copy(order="C")  # keeps 0-d arrays 0-d
    flat = array.reshape(-1).view(np.uint8) if array.dtype.itemsize else np.zeros(0, np.uint8)
    return Prepared(flat, _numpy_dtype_name(array.dtype), tuple(int(s) for s in array.shape), int(array.size),
                     int(array.dtype.itemsize), "cpu", "numpy", array)


def _prepare_torch(tensor: Any, name: str | None) -> Prepared:
    torch = import_torch()
    if type(tensor).__name__ == "DTensor" and hasattr(tensor, "to_local"):
        tensor = tensor.to_local()  # this rank's shard
    if tensor.layout != torch.strided:
        raise _type_error(tensor, name, f"torch layout {tensor.layout} is not dense (call .to_dense() first)")
    if tensor.is_quantized:
        raise _type_error(tensor, name, "quantized tensors are not supported (pass .int_repr())")
    if tensor.device.type == "meta":
        raise _type_error(tensor, name, "a meta tensor has no data")
    tensor = tensor.detach()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    tensor = tensor.contiguous()
    if tensor.device.type not in ("cpu", "cuda"):
        tensor = tensor.cpu()  # mps, xpu...: digest on the host
    flat = tensor.reshape(-1)
    try:
        data = flat.view(torch.uint8)
    except RuntimeError:  # storage offset not aligned for a dtype view
        data = flat.clone().view(torch.uint8)
    device = str(tensor.device) if tensor.device.type == "cuda" else "cpu"
    if device == "cpu":
        data = data.numpy()
    return Prepared(data, str(tensor.dtype).removeprefix("torch."), tuple(int(s) for s in tensor.shape),
                     int(tensor.numel()), int(tensor.element_size()), device, "torch", tensor)



def named_items(tensors: Any, *, prefix: str = "param") -> list[tuple[str, Any]]:
    """Normalise what users pass into ``[(name, value), ...]``.

    Accepts a mapping, ``model.named_parameters()`` (pairs), ``model.parameters()``
    or any iterable of tensors (named ``param_0``, ``param_1``...), a module
    (its named parameters), or a single tensor (named ``tensor``).
    """
    if tensors is None:
        raise TypeError("expected tensors, got None")
    if is_torch_tensor(tensors) or isinstance(tensors, (np.ndarray, np.generic)):
        return [("tensor", tensors)]
    if isinstance(tensors, Mapping):
        return [(str(key), value) for key, value in tensors.items()]
    named = getattr(tensors, "named_parameters", None)
    if callable(named):
        return [(str(key), value) for key, value in named()]
    if isinstance(tensors, (str, bytes)) or not isinstance(tensors, Iterable):
        raise TypeError(f"expected a dict of tensors, named_parameters() or parameters(), got {_describe(tensors)}")
    items: list[tuple[str, Any]] = []
    for index, item in enumerate(tensors):
        if (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            items.append(item)
        else:
            items.append((f"{prefix}_{index}", item))
    names = [key for key, _ in items]
    if len(set(names)) != len(names):
        duplicate = next(key for key in names if names.count(key) > 1)
        raise TypeError(f"tensor name {duplicate!r} appears twice; names must be unique")
    return items
