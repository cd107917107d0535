"""Fingerprints: bitwise chunk digests of tensors, computed where they live.

A :class:`Fingerprint` says, in a few hundred bytes, exactly what a tensor
holds: its dtype, shape, one 64-bit digest per fixed-size chunk of its
elements, a digest of the whole, and (optionally) float64 statistics.

Bitwise mode never upcasts. The tensor's bytes are read as they are in
memory (after a copy only for non-contiguous or byte-swapped layouts, so
equal tensors give equal digests whatever their strides):

- on the CPU (numpy arrays, CPU torch tensors) each chunk is hashed with
  XXH3-64 straight from the buffer: measured at the speed of ``numpy.sum``
  over the same buffer (``bench/bench_fingerprint.py``). ``xxhash`` is a
  dependency; where it is missing anyway the chunks are hashed with BLAKE2b
  and the fingerprint says ``algorithm="blake2b"`` (never ``xxh3``), so a
  comparison with an xxh3 rank is rehashed with ``wsum`` or called
  incomparable, never a false mismatch;
- on CUDA the bytes are viewed as 64-bit words and reduced with torch ops on
  the device, per chunk: a wrapping sum and a position-weighted wrapping sum
  (``wsum``), mixed into one 64-bit value. Only the chunk digests (8 bytes
  per 4 MiB) come back to the host. ``wsum`` also has a numpy
  implementation giving identical digests, so CPU and GPU ranks can be
  compared (``fingerprint(x, algorithm="wsum")``).

Chunks are element-aligned (``chunk_elems`` elements of ``CHUNK_BYTES``
bytes), so a differing chunk digest names an element range; comparing the
bytes of that one chunk names the first differing element. That is how
:mod:`raysleuth.consistency` localises a divergence while shipping only
digests and, at most, the disagreeing chunks.

torch is optional: it is imported only when a torch tensor is given.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

try:  # pragma: no cover - exercised by whichever is installed
    import xxhash as _xxhash
except ImportError:  # pragma: no cover
    _xxhash = None

__all__ = [
    "CHUNK_BYTES",
    "Fingerprint",
    "TensorStats",
    "chunk_bytes",
    "decode_values",
    "first_difference",
    "fingerprint",
    "fingerprint_many",
    "named_items",
]

CHUNK_BYTES = 4 * 1024 * 1024
"""Bytes per chunk (rounded down to whole elements)."""

_MASK = (1 << 64) - 1
_WSUM_BATCH = 16  # chunks reduced per torch op on CUDA (bounds the temporary to 64 MiB)
_NUMERIC_KINDS = "biufc"


# ---------------------------------------------------------------- results


@dataclass
class TensorStats:
    """Float64 statistics of a tensor (complex values: of their magnitude).

    ``min``/``max``/``mean``/``std`` are over finite values; ``l1``/``l2``/
    ``max_abs`` too. ``None`` where there is no finite value.
    """

    count: int = 0
    nan_count: int = 0
    inf_count: int = 0
    l1: float | None = None
    l2: float | None = None
    max_abs: float | None = None
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None


@dataclass
class Fingerprint:
    """What a tensor holds, in digests: compare two to know if, and where, they differ."""

    dtype: str
    """Canonical dtype name without framework (``float32``, ``bfloat16``, ``bool``, ``<U5``)."""
    shape: tuple[int, ...]
    numel: int
    itemsize: int
    device: str
    """Where it was computed: ``cpu`` or ``cuda:N``."""
    algorithm: str
    """``xxh3`` (CPU default), ``blake2b`` (CPU without ``xxhash``) or ``wsum`` (CUDA; same digests on CPU
    with ``algorithm="wsum"``). Digests of different algorithms are not comparable."""
    chunk_elems: int
    """Elements per chunk; chunk ``c`` covers flat elements ``[c*chunk_elems, (c+1)*chunk_elems)``."""
    digest: str
    """16 hex digits over dtype, shape and every chunk digest."""
    chunks: np.ndarray = field(repr=False)
    """One uint64 digest per chunk."""
    stats: TensorStats | None = None
    name: str | None = None
    framework: str = "numpy"
    """``numpy`` or ``torch`` (not compared: a torch and a numpy float32 tensor can be equal)."""

    @property
    def num_chunks(self) -> int:
        """How many chunks."""
        return int(len(self.chunks))

    def chunk_range(self, chunk: int) -> tuple[int, int]:
        """The flat element range ``[start, stop)`` of ``chunk``."""
        start = chunk * self.chunk_elems
        return start, min(self.numel, start + self.chunk_elems)

    def differing_chunks(self, other: "Fingerprint") -> list[int]:
        """Indices of chunks whose digests differ (same layout assumed)."""
        if self.chunk_elems != other.chunk_elems or self.algorithm != other.algorithm:
            raise ValueError("fingerprints use different chunking or algorithms; compare like with like")
        n = min(len(self.chunks), len(other.chunks))
        diff = np.flatnonzero(self.chunks[:n] != other.chunks[:n]).tolist()
        return diff + list(range(n, max(len(self.chunks), len(other.chunks))))

    def same_as(self, other: "Fingerprint") -> bool:
        """Bitwise equal (dtype, shape and every byte)."""
        return self.digest == other.digest and self.algorithm == other.algorithm

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: chunk digests as 16-digit hex strings."""
        data = asdict(self)
        data["chunks"] = [f"{int(c):016x}" for c in self.chunks]
        data["shape"] = list(self.shape)
        return data


# ---------------------------------------------------------------- input


def _torch():
    import torch

    return torch


def _is_torch_tensor(value: Any) -> bool:
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
class _Prepared:
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
    if dtype.kind in _NUMERIC_KINDS or dtype.kind in "mM":
        return dtype.name
    return dtype.newbyteorder("=").str if dtype.byteorder not in "|" else dtype.str


def _prepare(value: Any, name: str | None = None) -> _Prepared:
    if _is_torch_tensor(value):
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
    return _Prepared(flat, _numpy_dtype_name(array.dtype), tuple(int(s) for s in array.shape), int(array.size),
                     int(array.dtype.itemsize), "cpu", "numpy", array)


def _prepare_torch(tensor: Any, name: str | None) -> _Prepared:
    torch = _torch()
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
    return _Prepared(data, str(tensor.dtype).removeprefix("torch."), tuple(int(s) for s in tensor.shape),
                     int(tensor.numel()), int(tensor.element_size()), device, "torch", tensor)


# ---------------------------------------------------------------- digests


def _fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, elementwise on uint64 arrays (wrapping)."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB93FE53A4EC5)
    x ^= x >> np.uint64(33)
    return x


def _mix_wsum(s1: np.ndarray, s2: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    return _fmix64(s1 ^ _fmix64(s2 + nbytes.astype(np.uint64)))


def _chunk_spans(prepared: _Prepared, chunk_elems: int) -> list[tuple[int, int]]:
    nbytes = prepared.numel * prepared.itemsize
    step = chunk_elems * prepared.itemsize
    if nbytes == 0 or step == 0:
        return []
    return [(start, min(nbytes, start + step)) for start in range(0, nbytes, step)]


def _digest_bytes(data: np.ndarray, spans: list[tuple[int, int]], algorithm: str) -> np.ndarray:
    view = memoryview(data)
    if algorithm == "xxh3":
        hasher = _xxhash.xxh3_64_intdigest
        return np.fromiter((hasher(view[a:b]) for a, b in spans), dtype=np.uint64, count=len(spans))
    return np.fromiter((int.from_bytes(hashlib.blake2b(view[a:b], digest_size=8).digest(), "little")
                        for a, b in spans), dtype=np.uint64, count=len(spans))


def _wsum_numpy(data: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    s1 = np.zeros(len(spans), np.uint64)
    s2 = np.zeros(len(spans), np.uint64)
    lengths = np.array([b - a for a, b in spans], np.uint64)
    weights = np.arange(1, CHUNK_BYTES // 8 + 2, dtype=np.uint64)
    scratch = np.empty(len(weights), np.uint64)
    for i, (a, b) in enumerate(spans):
        raw = data[a:b]
        if (b - a) % 8 or a % 8:
            padded = np.zeros(-(-(b - a) // 8) * 8, np.uint8)
            padded[: b - a] = raw
            raw = padded
        words = raw.view(np.uint64)
        s1[i] = np.add.reduce(words)
        product = np.multiply(words, weights[: len(words)], out=scratch[: len(words)])
        s2[i] = np.add.reduce(product)
    return _mix_wsum(s1, s2, lengths)


def _wsum_torch(data: Any, spans: list[tuple[int, int]]) -> np.ndarray:
    """The ``wsum`` digest on the tensor's device; returns the chunk digests on the host."""
    torch = _torch()
    if not spans:
        return np.zeros(0, np.uint64)
    step = spans[0][1] - spans[0][0]
    full = sum(1 for a, b in spans if b - a == step) if step % 8 == 0 else 0
    words_per_chunk = step // 8
    weights = torch.arange(1, words_per_chunk + 1, dtype=torch.int64, device=data.device)
    s1_parts, s2_parts = [], []
    if full:
        body = data[: full * step]
        try:
            words = body.view(torch.int64).view(full, words_per_chunk)
        except RuntimeError:
            words = body.clone().view(torch.int64).view(full, words_per_chunk)
        for first in range(0, full, _WSUM_BATCH):
            block = words[first:first + _WSUM_BATCH]
            s1_parts.append(block.sum(dim=1, dtype=torch.int64))
            s2_parts.append((block * weights).sum(dim=1, dtype=torch.int64))
    for a, b in spans[full:]:
        padded = torch.zeros(-(-(b - a) // 8) * 8, dtype=torch.uint8, device=data.device)
        padded[: b - a] = data[a:b]
        words = padded.view(torch.int64)
        s1_parts.append(words.sum(dtype=torch.int64).reshape(1))
        s2_parts.append((words * torch.arange(1, len(words) + 1, dtype=torch.int64, device=data.device))
                        .sum(dtype=torch.int64).reshape(1))
    s1 = torch.cat(s1_parts).cpu().numpy().view(np.uint64)
    s2 = torch.cat(s2_parts).cpu().numpy().view(np.uint64)
    lengths = np.array([b - a for a, b in spans], np.uint64)
    return _mix_wsum(s1, s2, lengths)


def _whole_digest(dtype: str, shape: tuple[int, ...], algorithm: str, chunk_elems: int, chunks: np.ndarray) -> str:
    header = f"{dtype}|{','.join(map(str, shape))}|{algorithm}|{chunk_elems}|".encode()
    payload = header + np.ascontiguousarray(chunks, dtype="<u8").tobytes()
    if algorithm == "xxh3":  # the whole digest depends on the algorithm only, not on what is installed
        return f"{_xxhash.xxh3_64_intdigest(payload):016x}"
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


# ---------------------------------------------------------------- statistics


def _stats_numpy(array: np.ndarray) -> TensorStats | None:
    if array.dtype.kind not in _NUMERIC_KINDS:
        return None
    stats = _StatsAccumulator()
    flat = array.reshape(-1)
    step = max(1, CHUNK_BYTES // 8)
    for start in range(0, flat.size, step):
        part = flat[start:start + step]
        values = np.abs(part).astype(np.float64) if part.dtype.kind == "c" else part.astype(np.float64)
        stats.add(values, np)
    return stats.result(int(flat.size))


def _stats_torch(tensor: Any) -> TensorStats | None:
    torch = _torch()
    if tensor.dtype in (getattr(torch, "float4_e2m1fn_x2", None),):
        return None  # packed sub-byte floats: no elementwise conversion
    flat = tensor.reshape(-1)
    stats = _StatsAccumulator()
    step = max(1, CHUNK_BYTES // 8)
    try:
        for start in range(0, flat.numel(), step):
            part = flat[start:start + step]
            if part.is_complex():
                part = part.abs()
            if part.device.type == "cpu":
                # narrow floats convert fastest through float32 (exact), then numpy float64 reductions
                narrow = part.is_floating_point() and part.element_size() <= 2
                values = part.to(torch.float32).numpy() if narrow else part.to(torch.float64).numpy()
                with np.errstate(invalid="ignore"):  # signalling NaN bit patterns
                    stats.add(values.astype(np.float64), np)
            else:
                stats.add(part.to(torch.float64), torch)
    except (RuntimeError, TypeError):
        return None  # a dtype with no float conversion on this device
    return stats.result(int(flat.numel()))


class _StatsAccumulator:
    """Float64 running statistics over chunks (numpy or torch, same calls)."""

    def __init__(self) -> None:
        self.nan = self.inf = self.finite = 0
        self.l1 = self.l2 = self.total = 0.0
        self.max_abs = self.min = self.max = None

    def add(self, values: Any, lib: Any) -> None:
        finite_mask = lib.isfinite(values)
        if bool(finite_mask.all()):
            finite = values  # the common case: no mask, no copy
        else:
            nan = int(lib.isnan(values).sum())
            self.nan += nan
            self.inf += int((~finite_mask).sum()) - nan
            finite = values[finite_mask]
        count = int(finite.numel() if hasattr(finite, "numel") else finite.size)
        if not count:
            return
        self.finite += count
        self.l1 += float(lib.abs(finite).sum())
        self.l2 += float((finite * finite).sum())
        self.total += float(finite.sum())
        low, high = float(finite.min()), float(finite.max())
        self.min = low if self.min is None else min(self.min, low)
        self.max = high if self.max is None else max(self.max, high)
        top = max(abs(low), abs(high))
        self.max_abs = top if self.max_abs is None else max(self.max_abs, top)

    def result(self, count: int) -> TensorStats:
        stats = TensorStats(count=count, nan_count=self.nan, inf_count=self.inf)
        if self.finite:
            mean = self.total / self.finite
            stats.l1, stats.l2, stats.max_abs = self.l1, math.sqrt(self.l2), self.max_abs
            stats.min, stats.max, stats.mean = self.min, self.max, mean
            stats.std = math.sqrt(max(0.0, self.l2 / self.finite - mean * mean))
        return stats


# ---------------------------------------------------------------- public


def fingerprint(tensor: Any, *, name: str | None = None, stats: bool = False, algorithm: str = "auto",
                chunk_size: int = CHUNK_BYTES) -> Fingerprint:
    """Fingerprint one tensor or array on its own device.

    ``algorithm``: ``auto`` (XXH3 on the CPU, ``wsum`` on CUDA), ``xxh3``,
    ``blake2b`` or ``wsum`` (identical digests on CPU and CUDA).
    ``stats=True`` adds float64 statistics (min/max/mean/std/norms/NaN
    counts): a few extra passes, so off by default to keep the default call
    at memory speed. Raises :class:`TypeError` naming the entry for anything
    that is not a tensor.
    """
    prepared = _prepare(tensor, name)
    if algorithm == "auto":
        algorithm = "wsum" if prepared.device.startswith("cuda") else ("xxh3" if _xxhash is not None else "blake2b")
    if algorithm not in ("xxh3", "blake2b", "wsum"):
        raise ValueError(f"unknown fingerprint algorithm {algorithm!r}: use 'auto', 'xxh3', 'blake2b' or 'wsum'")
    if algorithm == "xxh3" and _xxhash is None:
        raise ValueError("algorithm 'xxh3' needs the xxhash package (pip install xxhash); "
                         "use 'auto' to fall back to 'blake2b'")
    if algorithm == "wsum" and chunk_size > CHUNK_BYTES:
        raise ValueError(f"wsum chunks are at most {CHUNK_BYTES} bytes")
    chunk_elems = max(1, chunk_size // max(1, prepared.itemsize))
    spans = _chunk_spans(prepared, chunk_elems)
    on_cuda = prepared.device.startswith("cuda")
    if algorithm == "wsum":
        chunks = _wsum_torch(prepared.data, spans) if on_cuda else _wsum_numpy(prepared.data, spans)
    else:
        data = prepared.data.cpu().numpy() if on_cuda else prepared.data
        chunks = _digest_bytes(data, spans, algorithm)
    summary = None
    if stats:
        summary = _stats_torch(prepared.source) if prepared.framework == "torch" else _stats_numpy(prepared.source)
    return Fingerprint(
        dtype=prepared.dtype, shape=prepared.shape, numel=prepared.numel, itemsize=prepared.itemsize,
        device=prepared.device, algorithm=algorithm, chunk_elems=chunk_elems,
        digest=_whole_digest(prepared.dtype, prepared.shape, algorithm, chunk_elems, chunks),
        chunks=chunks, stats=summary, name=name, framework=prepared.framework,
    )


def named_items(tensors: Any, *, prefix: str = "param") -> list[tuple[str, Any]]:
    """Normalise what users pass into ``[(name, value), ...]``.

    Accepts a mapping, ``model.named_parameters()`` (pairs), ``model.parameters()``
    or any iterable of tensors (named ``param_0``, ``param_1``...), a module
    (its named parameters), or a single tensor (named ``tensor``).
    """
    if tensors is None:
        raise TypeError("expected tensors, got None")
    if _is_torch_tensor(tensors) or isinstance(tensors, (np.ndarray, np.generic)):
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


def fingerprint_many(named_tensors: Any, *, stats: bool = False, algorithm: str = "auto") -> dict[str, Fingerprint]:
    """Fingerprint every entry of a dict / ``named_parameters()`` / ``parameters()``; keeps order."""
    return {key: fingerprint(value, name=key, stats=stats, algorithm=algorithm)
            for key, value in named_items(named_tensors)}


def chunk_bytes(tensor: Any, fp: Fingerprint, chunk: int) -> bytes:
    """The raw bytes of one chunk of ``tensor`` (copied to the host): what a rank ships to localise a diff."""
    prepared = _prepare(tensor, fp.name)
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
    if np_dtype is not None and np_dtype.kind in _NUMERIC_KINDS:
        values = np.frombuffer(raw, np_dtype)
        return values.astype(np.complex128 if np_dtype.kind == "c" else np.float64)
    torch = _torch() if dtype.startswith(("bfloat", "float", "complex", "uint", "int")) else None
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
