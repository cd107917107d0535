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
  comparison with an xxh3 rank is rehashed with ``mix64`` or called
  incomparable, never a false mismatch;
- on CUDA the bytes are viewed as 64-bit words and reduced with torch ops on
  the device, per chunk (``mix64``): each word goes through MurmurHash3's
  finaliser with its first multiplier replaced by an odd key of the word's
  position, and the mixed words are summed with wrap-around. The xor-shifts
  make each word's share nonlinear, so structured errors (sign flips at a
  stride, two sign flips, swapped or permuted words, +-1 ulp patterns) do
  not cancel in the sum as they did in the weighted sum it replaced
  (``wsum``). Only the chunk digests (8 bytes per 4 MiB) come back to the
  host. ``mix64`` also has a numpy implementation giving identical digests,
  so CPU and GPU ranks can be compared (``fingerprint(x, algorithm="mix64")``).

Chunks are element-aligned (``chunk_elems`` elements of ``CHUNK_BYTES``
bytes), so a differing chunk digest names an element range; comparing the
bytes of that one chunk names the first differing element. That is how
:mod:`raysleuth.consistency` localises a divergence while shipping only
digests and, at most, the disagreeing chunks.

The package, by what each module holds: :mod:`.tensors` (what can be
fingerprinted, reduced to its bytes; ``named_items``), :mod:`.result`
(``Fingerprint``, ``TensorStats``), :mod:`.digest` (the chunk digests,
``fingerprint``), :mod:`.stats` (the float64 statistics) and :mod:`.chunks`
(one chunk's bytes, the first differing element, decoding values). No
module is named ``fingerprint``: importing it would shadow the function.

torch is optional: it is imported only when a torch tensor is given.
"""

from __future__ import annotations

from raysleuth.fingerprints.chunks import chunk_bytes, decode_values, first_difference
from raysleuth.fingerprints.digest import fingerprint, fingerprint_many
from raysleuth.fingerprints.result import Fingerprint, TensorStats
from raysleuth.fingerprints.tensors import CHUNK_BYTES, named_items

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
