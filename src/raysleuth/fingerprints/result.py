"""What a fingerprint says: :class:`Fingerprint` (digests) and :class:`TensorStats` (statistics)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["Fingerprint", "TensorStats"]


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
    """``xxh3`` (CPU default), ``blake2b`` (CPU without ``xxhash``) or ``mix64`` (CUDA; same digests on CPU
    with ``algorithm="mix64"``). Digests of different algorithms are not comparable."""
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
