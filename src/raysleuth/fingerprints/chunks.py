"""One chunk at a time: its raw bytes, the first element that differs, its values as numbers."""

from __future__ import annotations

from typing import Any

import numpy as np

from raysleuth.fingerprints.result import Fingerprint
from raysleuth.fingerprints.tensors import NUMERIC_KINDS, import_torch, prepare

__all__ = ["chunk_bytes", "decode_values", "first_difference"]


def chunk_bytes(tensor: Any, fp: Fingerprint, chunk: int) -> bytes:
    """The raw bytes of one chunk of ``tensor`` (copied to the host): what a rank ships to localise a diff."""
    prepared = prepare(tensor, fp.name)
    start, stop = fp.chunk_range(chunk)
    part = prepared.data[start * prepared.itemsize: stop * prepared.itemsize]
    if not isinstance(part, np.ndarray):
        part = part.cpu().numpy()
    return part.tobytes()


def first_difference(left: bytes, right: bytes, itemsize: int) -> int | None:
    """Index of the first element whose bytes differ between two chunk payloads, or None."""
    n = min(len(left), len(right)) // max(1, itemsize)
    a = np.frombuffer(left, np.uint8, count=n * itemsize).reshape(n, itemsize)
    b = np.frombuffer(right, np.uint8, count=n * itemsize).reshape(n, itemsize)
    differs = np.any(a != b, axis=1)
    if differs.any():
        return int(np.argmax(differs))
    if len(left) != len(right):
        return n
    return None


def decode_values(raw: bytes, dtype: str) -> np.ndarray | None:
    """Chunk bytes of ``dtype`` as float64 (complex128 for complex), or None when not numeric."""
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        np_dtype = None
    if np_dtype is not None and np_dtype.kind in NUMERIC_KINDS:
        values = np.frombuffer(raw, np_dtype)
        return values.astype(np.complex128 if np_dtype.kind == "c" else np.float64)
    torch: Any = import_torch() if dtype.startswith(("bfloat", "float", "complex", "uint", "int")) else None
    torch_dtype = getattr(torch, dtype, None) if torch is not None else None
    if torch_dtype is None or not raw:
        return None if torch_dtype is None else np.zeros(0, np.float64)
    try:
        values = torch.frombuffer(bytearray(raw), dtype=torch_dtype)
        if values.is_complex():
            return values.to(torch.complex128).numpy()
        return values.to(torch.float64).numpy()
    except (RuntimeError, TypeError):
        return None
