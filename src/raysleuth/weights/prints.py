"""One weight's fingerprint as a sync stores it (:class:`WeightPrint`), and the canonical cast.

A print is what :func:`raysleuth.fingerprints.fingerprint` says about one
``(name, tensor)`` (dtype, shape, one digest per chunk, a digest of the
whole), keyed by the tensor's name and shard, in a JSON-ready form. Tensors
are never stored.

The canonical cast: two sides in different float precisions (an fp32
trainer, a bf16 engine) are compared at the lower precision. Where both
tensors are in one process (:func:`raysleuth.check_weight_sync`) the wider
one is cast there. Across processes the sender can add a second digest at
the lower precision (``canonical="bfloat16"``) for the receiver to compare
with; without it a dtype difference is reported as a dtype difference,
never as "differs at element 0".
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth.errors import UsageError
from raysleuth.fingerprints import fingerprint

__all__ = ["MANTISSA_BITS", "WeightPrint", "cast_to", "is_float_dtype", "lower_precision", "print_tensor"]

#: Significand bits of the float dtypes a weight sync meets; fewer bits = lower precision.
MANTISSA_BITS = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7,
                 "float8_e4m3fn": 3, "float8_e5m2": 2}


def is_float_dtype(dtype: str) -> bool:
    """A float dtype the canonical cast knows."""
    return dtype in MANTISSA_BITS


def lower_precision(left: str, right: str) -> str | None:
    """The float dtype of the two with fewer significand bits; None unless both are known, different floats."""
    if left == right or not (is_float_dtype(left) and is_float_dtype(right)):
        return None
    return left if MANTISSA_BITS[left] < MANTISSA_BITS[right] else right


def cast_to(tensor: Any, dtype: str) -> Any:
    """``tensor`` as ``dtype`` (torch's round-to-nearest-even, the cast an engine's loader does)."""
    import torch

    return tensor.to(getattr(torch, dtype))


@dataclasses.dataclass(kw_only=True)
class WeightPrint:
    """One tensor of a sync, in digests."""

    name: str
    shard: int | None = None
    """Which shard of ``name`` this is (a tensor-parallel rank), or None for the whole tensor."""
    dtype: str
    shape: list[int]
    numel: int
    algorithm: str
    chunk_elems: int
    digest: str
    chunks: list[str]
    """One 16-hex-digit digest per chunk of ``chunk_elems`` elements."""
    canonical: dict[str, Any] | None = None
    """The same tensor cast to a lower precision: ``{"dtype", "digest", "chunks", "chunk_elems"}``."""

    @property
    def key(self) -> tuple[str, int | None]:
        return self.name, self.shard

    def element_range(self, chunk: int, chunk_elems: int | None = None) -> list[int]:
        """The flat element range ``[start, stop)`` that chunk ``chunk`` covers."""
        size = chunk_elems or self.chunk_elems
        return [chunk * size, min(self.numel, (chunk + 1) * size)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WeightPrint":
        """Back from :meth:`to_dict`; raises TypeError/ValueError on a row that is not a print."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError("not a weight print")
        shard = data.get("shard")
        canonical = data.get("canonical")
        return cls(name=data["name"], shard=int(shard) if shard is not None else None, dtype=str(data["dtype"]),
                   shape=[int(s) for s in data.get("shape") or []], numel=int(data.get("numel", 0)),
                   algorithm=str(data.get("algorithm", "")), chunk_elems=int(data.get("chunk_elems", 1)),
                   digest=str(data["digest"]), chunks=[str(c) for c in data.get("chunks") or []],
                   canonical=canonical if isinstance(canonical, dict) else None)


def print_tensor(name: Any, tensor: Any, *, shard: int | None = None, canonical: str | None = None,
                 algorithm: str = "auto") -> WeightPrint:
    """Fingerprint one ``(name, tensor)`` of a sync. Raises :class:`UsageError` for anything but a tensor."""
    if not isinstance(name, str):
        raise UsageError(f"weight sync entry {name!r}: the name is {type(name).__name__}, not str",
                         fix="pass (name, tensor) pairs, e.g. model.named_parameters()")
    try:
        fp = fingerprint(tensor, name=name, algorithm=algorithm)
    except TypeError as error:
        raise UsageError(f"weight sync entry {name!r} is not a tensor ({error})",
                         fix="pass (name, torch.Tensor) pairs") from None
    extra = None
    if canonical and canonical != fp.dtype and lower_precision(fp.dtype, canonical) == canonical:
        cast = fingerprint(cast_to(tensor, canonical), name=name, algorithm=algorithm)
        extra = {"dtype": cast.dtype, "digest": cast.digest, "chunk_elems": cast.chunk_elems,
                 "chunks": [f"{int(c):016x}" for c in cast.chunks]}
    return WeightPrint(name=name, shard=shard, dtype=fp.dtype, shape=list(fp.shape), numel=fp.numel,
                       algorithm=fp.algorithm, chunk_elems=fp.chunk_elems, digest=fp.digest,
                       chunks=[f"{int(c):016x}" for c in fp.chunks], canonical=extra)
