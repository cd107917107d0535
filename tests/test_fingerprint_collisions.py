"""``mix64``, the digest computed on a device (and the rehash of mixed CPU/CUDA ranks), against
structured corruptions: each chunk digest must change exactly where the chunk's bytes changed.

The weighted sum it replaced (``wsum``: Σw and Σ(i+1)w mod 2^64) gave equal digests when
every 4th bf16 element was negated or when two fp32 signs flipped; these tests are the
corruptions a real divergence makes (sign flips at strides, permutations, swapped chunks,
±1 ulp, zeroed ranges, a bf16 buffer read as fp16) drawn by hypothesis, plus a count of
collisions over tens of thousands of structured variants of one chunk.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raysleuth.fingerprints import chunk_bytes, fingerprint
from raysleuth.fingerprints import digest as digest_module

CHUNK = 256  # bytes per chunk: several chunks per drawn tensor
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _base(dtype: torch.dtype, numel: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=generator, dtype=torch.float64).to(dtype)


def _assert_digest_follows_bytes(before: torch.Tensor, after: torch.Tensor) -> None:
    """Chunk digests differ exactly where chunk bytes differ; the whole digest iff any byte differs."""
    one, two = fingerprint(before, algorithm="mix64", chunk_size=CHUNK), fingerprint(after, algorithm="mix64",
                                                                                   chunk_size=CHUNK)
    changed = [c for c in range(one.num_chunks) if chunk_bytes(before, one, c) != chunk_bytes(after, two, c)]
    assert one.differing_chunks(two) == changed
    assert (one.digest != two.digest) == bool(changed)


corruptions = st.sampled_from(["stride_sign", "two_signs", "permutation", "swap_chunks", "ulp", "zero_range"])


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(sorted(DTYPES)), st.integers(8, 700), st.integers(0, 2**31), corruptions, st.data())
def test_structured_corruptions_change_exactly_the_chunks_they_touch(dtype_name, numel, seed, kind, data):
    tensor = _base(DTYPES[dtype_name], numel, seed)
    after = tensor.clone()
    words = after.view(INT_VIEW[tensor.element_size()])
    if kind == "stride_sign":  # every s-th element negated, from an offset
        stride = data.draw(st.sampled_from([1, 2, 3, 4, 8, 16]), label="stride")
        after[data.draw(st.integers(0, stride - 1), label="offset")::stride] *= -1
    elif kind == "two_signs":
        i, j = data.draw(st.lists(st.integers(0, numel - 1), min_size=2, max_size=2, unique=True), label="ij")
        after[[i, j]] *= -1
    elif kind == "permutation":
        order = torch.tensor(data.draw(st.permutations(range(numel)), label="order"))
        after = tensor[order].clone()
    elif kind == "swap_chunks":
        per_chunk = CHUNK // tensor.element_size()
        chunks = -(-numel // per_chunk)
        if chunks < 3:  # two whole chunks to swap (the last one may be partial)
            return
        a, b = sorted(data.draw(st.lists(st.integers(0, chunks - 2), min_size=2, max_size=2, unique=True), label="ab"))
        span_a, span_b = slice(a * per_chunk, (a + 1) * per_chunk), slice(b * per_chunk, (b + 1) * per_chunk)
        after[span_a], after[span_b] = tensor[span_b].clone(), tensor[span_a].clone()
    elif kind == "ulp":  # +1 ulp on every other element, -1 ulp on the rest of a range (sums cancel)
        start = data.draw(st.integers(0, numel - 2), label="start")
        stop = data.draw(st.integers(start + 2, numel), label="stop")
        signs = torch.tensor([1, -1], dtype=words.dtype).repeat(-(-(stop - start) // 2))[: stop - start]
        words[start:stop] += signs
    else:
        start = data.draw(st.integers(0, numel - 1), label="start")
        after[start:data.draw(st.integers(start + 1, numel), label="stop")] = 0
    _assert_digest_follows_bytes(tensor, after)


@pytest.mark.parametrize("source, target", [(torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16)])
def test_a_bf16_buffer_read_as_fp16_is_never_equal(source, target):
    tensor = _base(source, 1000, 7)
    same_bytes = tensor.view(target)
    assert fingerprint(same_bytes, algorithm="mix64").digest != fingerprint(tensor, algorithm="mix64").digest
    converted = tensor.to(target).view(source)  # the values converted, read back in the old dtype
    _assert_digest_follows_bytes(tensor, converted)


def test_the_sign_flips_that_cancelled_in_wsum_are_seen():
    """The issue's cases: every 4th bf16 negated (1,024 flips), two fp32 and two fp64 signs flipped."""
    bf16 = _base(torch.bfloat16, 4096, 1)
    flipped = bf16.clone()
    flipped[3::4] *= -1
    assert fingerprint(flipped, algorithm="mix64").digest != fingerprint(bf16, algorithm="mix64").digest
    for dtype in (torch.float32, torch.float64):
        tensor = _base(dtype, 4096, 2)
        for i, j in [(0, 2), (10, 4000), (1, 3), (100, 101)]:
            two = tensor.clone()
            two[[i, j]] *= -1
            assert fingerprint(two, algorithm="mix64").digest != fingerprint(tensor, algorithm="mix64").digest


def _structured_variants(base: np.ndarray) -> np.ndarray:
    """Tens of thousands of rows, each ``base`` (64-bit words) with one structured corruption."""
    n = len(base)
    sign = np.uint64(1 << 63)
    rows = []
    for stride_bits, lane_bits in ((64, 64), (32, 32), (16, 16)):  # fp64 / fp32 / bf16 lanes of the words
        for lane in range(64 // lane_bits):
            bit = np.uint64(1 << (lane * lane_bits + lane_bits - 1))
            for stride in (1, 2, 3, 4, 5, 8, 16):
                for offset in range(stride):
                    row = base.copy()
                    row[offset::stride] ^= bit
                    rows.append(row)
    for i in range(n):  # every pair of sign flips, +-1 ulp pairs and swaps among the first 150 words
        for j in range(i + 1, min(n, 150)):
            two = base.copy()
            two[[i, j]] ^= sign
            rows.append(two)
            ulp = base.copy()
            ulp[i] += np.uint64(1)
            ulp[j] -= np.uint64(1)
            rows.append(ulp)
            swapped = base.copy()
            swapped[[i, j]] = base[[j, i]]
            rows.append(swapped)
    for start in range(0, n, 3):  # zeroed ranges
        for length in (1, 2, 7, 64, n):
            row = base.copy()
            row[start:start + length] = 0
            rows.append(row)
    rng = np.random.default_rng(5)
    for _ in range(2000):  # random permutations and rotations
        rows.append(base[rng.permutation(n)])
    for shift in range(1, n):
        rows.append(np.roll(base, shift))
    return np.stack(rows)


def test_no_collision_among_tens_of_thousands_of_structured_variants():
    base = np.random.default_rng(3).integers(0, 2**64, 256, dtype=np.uint64)  # one 2 KiB chunk
    variants = np.vstack([base, _structured_variants(base)])
    sums = digest_module._mix_rows_numpy(variants)
    contents: dict[int, bytes] = {}
    for row, value in zip(variants, sums.tolist()):
        assert contents.setdefault(value, row.tobytes()) == row.tobytes(), "two different chunks share a digest"
    assert len(contents) > 30_000  # distinct chunks seen, each with a digest of its own


def test_the_device_path_gives_the_numpy_digests():
    """The torch implementation (run here on CPU tensors) and the numpy one agree bit for bit."""
    from raysleuth.fingerprints.tensors import prepare

    tensor = _base(torch.bfloat16, 3 * 1024 * 1024 + 5, 4)  # two full 4 MiB chunks and a ragged tail
    prepared = prepare(tensor, None)
    for chunk_elems in (2 * 1024 * 1024, 32, 50, 3):
        spans = digest_module._chunk_spans(prepared, chunk_elems)[:200] + digest_module._chunk_spans(prepared,
                                                                                                   chunk_elems)[-1:]
        on_host = digest_module._mix64_numpy(prepared.data, spans)
        with_torch = digest_module._mix64_torch(torch.from_numpy(prepared.data), spans)
        assert (on_host == with_torch).all(), chunk_elems


def test_wsum_is_gone_with_a_reason():
    with pytest.raises(ValueError, match="replaced by 'mix64'"):
        fingerprint(np.zeros(4), algorithm="wsum")
