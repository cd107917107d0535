"""Chunk digests (XXH3-64, BLAKE2b, ``mix64`` on CPU or a device) and :func:`fingerprint` itself."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from raysleuth.fingerprints.result import Fingerprint
from raysleuth.fingerprints.stats import stats_numpy, stats_torch
from raysleuth.fingerprints.tensors import CHUNK_BYTES, Prepared, import_torch, named_items, prepare

_xxhash: Any
try:  # pragma: no cover - exercised by whichever is installed
    import xxhash as _xxhash
except ImportError:  # pragma: no cover
    _xxhash = None

__all__ = ["fingerprint", "fingerprint_many"]

_MIX_BATCH = 16  # chunks mixed per torch op on a device (bounds each temporary to 64 MiB)
_MIX_BLOCK = 128 * 1024  # words mixed per numpy op on the CPU (1 MiB: the temporaries stay in cache)
_C1 = 0xFF51AFD7ED558CCD  # MurmurHash3's finaliser constants
_C2 = 0xC4CEB93FE53A4EC5
_MASK31 = (1 << 31) - 1  # a logical shift by 33 on int64 words (torch shifts int64 arithmetically)
_keys_cache: dict[str, Any] = {}


def _fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, elementwise on uint64 arrays (wrapping)."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(33)
    x *= np.uint64(_C1)
    x ^= x >> np.uint64(33)
    x *= np.uint64(_C2)
    x ^= x >> np.uint64(33)
    return x


def _position_keys() -> np.ndarray:
    """One odd 64-bit key per word position in a chunk: MurmurHash3's finaliser of the position, made odd."""
    keys = _keys_cache.get("numpy")
    if keys is None:
        keys = _fmix64(np.arange(1, CHUNK_BYTES // 8 + 2, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        keys |= np.uint64(1)
        _keys_cache["numpy"] = keys
    return keys


def _finish(sums: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A chunk's digest from its wrapping sum of mixed words and its length in bytes."""
    return _fmix64(sums ^ _fmix64(lengths.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)))


def _mix_rows_numpy(words: np.ndarray) -> np.ndarray:
    """Per row of 64-bit words: the wrapping sum over positions ``j`` of the keyed mix of word ``j``.

    Each word is mixed the way MurmurHash3 finalises, with the first
    multiplier replaced by the odd key of its position: ``x ^= x >> 33;
    x *= key[j]; x ^= x >> 33; x *= C2; x ^= x >> 33``. The xor-shifts make
    the mix nonlinear in the sum, so structured errors (sign flips at a
    stride, swapped words, +-1 ulp patterns) do not cancel as in a weighted
    sum, and the key makes the same word count differently at each position.
    """
    rows, width = words.shape
    keys = _position_keys()
    sums = np.zeros(rows, np.uint64)
    per_row = min(width, _MIX_BLOCK)
    stride = max(1, _MIX_BLOCK // max(1, width))
    scratch, shifted = np.empty(_MIX_BLOCK, np.uint64), np.empty(_MIX_BLOCK, np.uint64)
    shift = np.uint64(33)
    for first in range(0, rows, stride):
        for column in range(0, width, per_row):
            block = words[first:first + stride, column:column + per_row]
            x = scratch[:block.size].reshape(block.shape)
            t = shifted[:block.size].reshape(block.shape)
            np.right_shift(block, shift, out=t)
            np.bitwise_xor(block, t, out=x)
            np.multiply(x, keys[column:column + block.shape[1]], out=x)
            np.right_shift(x, shift, out=t)
            np.bitwise_xor(x, t, out=x)
            np.multiply(x, np.uint64(_C2), out=x)
            np.right_shift(x, shift, out=t)
            np.bitwise_xor(x, t, out=x)
            sums[first:first + stride] += np.add.reduce(x, axis=1)
    return sums


def _chunk_spans(prepared: Prepared, chunk_elems: int) -> list[tuple[int, int]]:
    nbytes = prepared.numel * prepared.itemsize
    step = chunk_elems * prepared.itemsize
    if nbytes == 0 or step == 0:
        return []
    return [(start, min(nbytes, start + step)) for start in range(0, nbytes, step)]


def _digest_bytes(data: np.ndarray, spans: list[tuple[int, int]], algorithm: str) -> np.ndarray:
    view = memoryview(data)  # type: ignore[arg-type]  # numpy arrays are buffers; its stubs say so only for 3.12+
    if algorithm == "xxh3":  # the hasher object releases the GIL while it reads (the one-shot function does not)
        hasher = _xxhash.xxh3_64  # same XXH3-64 value as xxh3_64_intdigest: stored prints compare unchanged
        return np.fromiter((hasher(view[a:b]).intdigest() for a, b in spans), dtype=np.uint64, count=len(spans))
    return np.fromiter((int.from_bytes(hashlib.blake2b(view[a:b], digest_size=8).digest(), "little")
                        for a, b in spans), dtype=np.uint64, count=len(spans))


def _full_chunks(spans: list[tuple[int, int]]) -> tuple[int, int]:
    """How many leading chunks are whole (same size, a multiple of 8 bytes), and their size."""
    if not spans:
        return 0, 0
    step = spans[0][1] - spans[0][0]
    return (sum(1 for a, b in spans if b - a == step) if step % 8 == 0 else 0), step


def _mix64_numpy(data: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    full, step = _full_chunks(spans)
    parts = []
    if full:
        parts.append(_mix_rows_numpy(data[: full * step].view(np.uint64).reshape(full, step // 8)))
    for a, b in spans[full:]:
        padded = np.zeros(-(-(b - a) // 8) * 8, np.uint8)
        padded[: b - a] = data[a:b]
        parts.append(_mix_rows_numpy(padded.view(np.uint64).reshape(1, -1)))
    sums = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    return _finish(sums, np.array([b - a for a, b in spans], np.uint64))


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _mix_rows_torch(words: Any) -> Any:
    """:func:`_mix_rows_numpy` with torch ops on the words' device (int64 words, wrapping arithmetic)."""
    torch = import_torch()
    device = str(words.device)
    keys = _keys_cache.get(device)
    if keys is None:
        keys = torch.from_numpy(_position_keys().view(np.int64).copy()).to(words.device)
        _keys_cache[device] = keys
    keys = keys[: words.shape[1]]
    sums = []
    for first in range(0, words.shape[0], _MIX_BATCH):
        block = words[first:first + _MIX_BATCH]
        t = torch.bitwise_right_shift(block, 33).bitwise_and_(_MASK31)
        x = torch.bitwise_xor(block, t).mul_(keys)
        torch.bitwise_right_shift(x, 33, out=t).bitwise_and_(_MASK31)
        x.bitwise_xor_(t).mul_(_signed(_C2))
        torch.bitwise_right_shift(x, 33, out=t).bitwise_and_(_MASK31)
        sums.append(x.bitwise_xor_(t).sum(dim=1, dtype=torch.int64))
    return torch.cat(sums)


def _mix64_torch(data: Any, spans: list[tuple[int, int]]) -> np.ndarray:
    """The ``mix64`` digest on the tensor's device; returns the chunk digests on the host."""
    torch = import_torch()
    if not spans:
        return np.zeros(0, np.uint64)
    full, step = _full_chunks(spans)
    parts = []
    if full:
        body = data[: full * step]
        try:
            words = body.view(torch.int64).view(full, step // 8)
        except RuntimeError:  # storage offset not aligned for an int64 view
            words = body.clone().view(torch.int64).view(full, step // 8)
        parts.append(_mix_rows_torch(words))
    for a, b in spans[full:]:
        padded = torch.zeros(-(-(b - a) // 8) * 8, dtype=torch.uint8, device=data.device)
        padded[: b - a] = data[a:b]
        parts.append(_mix_rows_torch(padded.view(torch.int64).view(1, -1)))
    sums = torch.cat(parts).cpu().numpy().view(np.uint64)  # the one read back: 8 bytes per chunk
    return _finish(sums, np.array([b - a for a, b in spans], np.uint64))


def _whole_digest(dtype: str, shape: tuple[int, ...], algorithm: str, chunk_elems: int, chunks: np.ndarray) -> str:
    header = f"{dtype}|{','.join(map(str, shape))}|{algorithm}|{chunk_elems}|".encode()
    payload = header + np.ascontiguousarray(chunks, dtype="<u8").tobytes()
    if algorithm == "xxh3":  # the whole digest depends on the algorithm only, not on what is installed
        return f"{_xxhash.xxh3_64_intdigest(payload):016x}"
    return hashlib.blake2b(payload, digest_size=8).hexdigest()



def fingerprint(tensor: Any, *, name: str | None = None, stats: bool = False, algorithm: str = "auto",
                chunk_size: int = CHUNK_BYTES) -> Fingerprint:
    """Fingerprint one tensor or array on its own device.

    ``algorithm``: ``auto`` (XXH3 on the CPU, ``mix64`` on CUDA), ``xxh3``,
    ``blake2b`` or ``mix64`` (a wrapping sum of position-keyed mixes of the
    64-bit words, in plain torch or numpy ops: identical digests on CPU and
    CUDA).
    ``stats=True`` adds float64 statistics (min/max/mean/std/norms/NaN
    counts): a few extra passes, so off by default to keep the default call
    at memory speed. Raises :class:`TypeError` naming the entry for anything
    that is not a tensor.
    """
    prepared = prepare(tensor, name)
    if algorithm == "auto":
        algorithm = "mix64" if prepared.device.startswith("cuda") else ("xxh3" if _xxhash is not None else "blake2b")
    if algorithm not in ("xxh3", "blake2b", "mix64"):
        raise ValueError(f"unknown fingerprint algorithm {algorithm!r}: use 'auto', 'xxh3', 'blake2b' or 'mix64'"
                         + (" ('wsum' was replaced by 'mix64': its sums cancelled on structured errors)"
                            if algorithm == "wsum" else ""))
    if algorithm == "xxh3" and _xxhash is None:
        raise ValueError("algorithm 'xxh3' needs the xxhash package (pip install xxhash); "
                         "use 'auto' to fall back to 'blake2b'")
    if algorithm == "mix64" and chunk_size > CHUNK_BYTES:
        raise ValueError(f"mix64 chunks are at most {CHUNK_BYTES} bytes")
    chunk_elems = max(1, chunk_size // max(1, prepared.itemsize))
    spans = _chunk_spans(prepared, chunk_elems)
    on_cuda = prepared.device.startswith("cuda")
    if algorithm == "mix64":
        chunks = _mix64_torch(prepared.data, spans) if on_cuda else _mix64_numpy(prepared.data, spans)
    else:
        data = prepared.data.cpu().numpy() if on_cuda else prepared.data
        chunks = _digest_bytes(data, spans, algorithm)
    summary = None
    if stats:
        summary = stats_torch(prepared.source) if prepared.framework == "torch" else stats_numpy(prepared.source)
    return Fingerprint(
        dtype=prepared.dtype, shape=prepared.shape, numel=prepared.numel, itemsize=prepared.itemsize,
        device=prepared.device, algorithm=algorithm, chunk_elems=chunk_elems,
        digest=_whole_digest(prepared.dtype, prepared.shape, algorithm, chunk_elems, chunks),
        chunks=chunks, stats=summary, name=name, framework=prepared.framework,
    )



def fingerprint_many(named_tensors: Any, *, stats: bool = False, algorithm: str = "auto") -> dict[str, Fingerprint]:
    """Fingerprint every entry of a dict / ``named_parameters()`` / ``parameters()``; keeps order."""
    return {key: fingerprint(value, name=key, stats=stats, algorithm=algorithm)
            for key, value in named_items(named_tensors)}

