"""Chunk digests (XXH3-64, BLAKE2b, ``wsum`` on CPU or CUDA) and :func:`fingerprint` itself."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from raysleuth.fingerprints.result import Fingerprint
from raysleuth.fingerprints.stats import stats_numpy, stats_torch
from raysleuth.fingerprints.tensors import CHUNK_BYTES, Prepared, import_torch, named_items, prepare

try:  # pragma: no cover - exercised by whichever is installed
    import xxhash as _xxhash
except ImportError:  # pragma: no cover
    _xxhash = None

__all__ = ["fingerprint", "fingerprint_many"]

_WSUM_BATCH = 16  # chunks reduced per torch op on CUDA (bounds the temporary to 64 MiB)


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


def _chunk_spans(prepared: Prepared, chunk_elems: int) -> list[tuple[int, int]]:
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
    torch = import_torch()
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
    prepared = prepare(tensor, name)
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

