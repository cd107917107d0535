"""The fingerprint engine and the pure comparison logic (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from raysleuth.consistency.report import ConsistencyReport, compare_fingerprints, localize
from raysleuth.fingerprints import (
    chunk_bytes,
    decode_values,
    fingerprint,
    fingerprint_many,
    first_difference,
    named_items,
)

SMALL_CHUNK = 64  # bytes: many chunks even for small arrays

dtypes = st.sampled_from([np.float32, np.float64, np.float16, np.int8, np.int32, np.uint64, np.bool_,
                          np.complex64])
arrays = dtypes.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, max_side=9)))


@settings(max_examples=50, deadline=None)
@given(arrays, st.sampled_from(["xxh3", "mix64"]))
def test_equal_tensors_give_equal_digests_across_layouts(array, algorithm):
    reference = fingerprint(array, algorithm=algorithm, chunk_size=SMALL_CHUNK, stats=False)
    layouts = [np.array(array, order="F"), array.copy(), array.astype(array.dtype.newbyteorder(">"))]
    if array.ndim:
        padded = np.empty(array.shape[:-1] + (array.shape[-1] * 2,), array.dtype)
        padded[..., ::2] = array
        layouts.append(padded[..., ::2])  # non-contiguous view
    layouts.append(torch.from_numpy(array.copy()))  # torch and numpy agree
    for layout in layouts:
        assert fingerprint(layout, algorithm=algorithm, chunk_size=SMALL_CHUNK, stats=False).digest \
            == reference.digest


@settings(max_examples=50, deadline=None)
@given(arrays.filter(lambda a: a.size > 0), st.data(), st.sampled_from(["xxh3", "mix64"]))
def test_any_single_element_change_is_detected_and_localised(array, data, algorithm):
    flat = data.draw(st.integers(0, array.size - 1), label="element")
    changed = array.copy()
    raw = changed.reshape(-1).view(np.uint8)
    byte = flat * array.itemsize + data.draw(st.integers(0, array.itemsize - 1), label="byte")
    raw[byte] ^= np.uint8(1 << data.draw(st.integers(0, 7), label="bit"))
    before = fingerprint(array, algorithm=algorithm, chunk_size=SMALL_CHUNK, stats=False)
    after = fingerprint(changed, algorithm=algorithm, chunk_size=SMALL_CHUNK, stats=False)
    assert before.digest != after.digest
    [chunk] = before.differing_chunks(after)
    start, stop = before.chunk_range(chunk)
    assert start <= flat < stop
    offset = first_difference(chunk_bytes(array, before, chunk), chunk_bytes(changed, after, chunk), array.itemsize)
    assert start + offset == flat


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(np.float32, st.integers(2, 300), elements=st.floats(-1e3, 1e3, width=32)), st.data())
def test_swapping_two_different_elements_changes_the_mix64_digest(array, data):
    i, j = data.draw(st.lists(st.integers(0, len(array) - 1), min_size=2, max_size=2, unique=True))
    if array.view(np.uint32)[i] == array.view(np.uint32)[j]:
        return
    swapped = array.copy()
    swapped[[i, j]] = swapped[[j, i]]
    for algorithm in ("xxh3", "mix64"):
        assert fingerprint(array, algorithm=algorithm).digest != fingerprint(swapped, algorithm=algorithm).digest


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn,
                                   torch.float8_e5m2, torch.bool, torch.int8, torch.uint8, torch.int16, torch.int64,
                                   torch.uint16, torch.uint32, torch.uint64, torch.complex64, torch.complex128])
def test_every_torch_dtype(dtype):
    values = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) % 7
    tensor = values.to(dtype) if dtype not in (torch.uint16, torch.uint32, torch.uint64) \
        else values.to(torch.int64).to(dtype)
    fp = fingerprint(tensor, stats=True)
    assert fp.dtype == str(dtype).removeprefix("torch.") and fp.shape == (2, 3, 4) and fp.numel == 24
    assert fp.algorithm == "xxh3" and fp.framework == "torch"
    assert fingerprint(tensor.transpose(0, 2).contiguous().transpose(0, 2)).digest == fp.digest
    assert fingerprint(tensor, algorithm="mix64").digest != fp.digest
    if dtype is not torch.bool:
        assert fp.stats is not None and fp.stats.count == 24 and fp.stats.max == pytest.approx(6, rel=0.1)
        changed = tensor.clone()
        changed[1, 2, 3] = tensor[0, 0, 1]  # 1 where it was 23 % 7 = 2
        assert fingerprint(changed).digest != fp.digest
        decoded = decode_values(tensor.reshape(-1).view(torch.uint8).numpy().tobytes(), fp.dtype)
        assert decoded is not None and decoded.shape == (24,)


def test_empty_zero_dim_and_strings():
    empty = fingerprint(torch.zeros(0, 3), stats=True)
    assert empty.num_chunks == 0 and empty.shape == (0, 3) and empty.stats.count == 0
    assert empty.digest != fingerprint(torch.zeros(3, 0)).digest  # the shape is part of the digest
    scalar = fingerprint(torch.tensor(2.5), stats=True)
    assert scalar.shape == () and scalar.num_chunks == 1 and scalar.stats.mean == 2.5
    assert fingerprint(np.float32(2.5)).digest == scalar.digest  # numpy and torch agree
    text = fingerprint(np.array(["ab", "cde"]), stats=True)
    assert text.dtype == "<U3" and text.stats is None
    assert fingerprint(torch.zeros(4, dtype=torch.complex64).conj()).digest \
        == fingerprint(torch.zeros(4, dtype=torch.complex64).conj().resolve_conj()).digest


def test_stats_are_float64_and_count_nan_inf():
    values = torch.tensor([1.0, -3.0, float("nan"), float("inf"), 2.0], dtype=torch.bfloat16)
    stats = fingerprint(values, stats=True).stats
    assert (stats.nan_count, stats.inf_count, stats.min, stats.max, stats.max_abs) == (1, 1, -3.0, 2.0, 3.0)
    assert stats.l1 == 6.0 and stats.l2 == pytest.approx(14 ** 0.5) and stats.mean == 0.0


@pytest.mark.parametrize("values", [
    torch.randn(3_000_001).to(torch.bfloat16), torch.tensor([1.0, float("nan"), float("inf"), -3.0, -float("inf")]),
    torch.tensor([float("nan")] * 3), torch.randn(999, dtype=torch.complex64), torch.arange(-50, 50, dtype=torch.int32),
], ids=["bf16", "nan-inf", "all-nan", "complex", "int32"])
def test_device_statistics_equal_the_host_ones(values, monkeypatch):
    """The GPU path (sums kept on the device, one copy at the end) is plain torch: run here on CPU tensors,
    in small chunks so that several are summed, it must give what the host path gives."""
    from raysleuth.fingerprints import stats as stats_module

    monkeypatch.setattr(stats_module, "DEVICE_STEP", 1 << 20)
    host = stats_module.stats_torch(values)
    device = stats_module._stats_on_device(values.reshape(-1), torch)
    for field, expected in vars(host).items():
        got = getattr(device, field)
        assert got == pytest.approx(expected, rel=1e-9) if expected is not None else got is None, field


def test_bad_entries_are_a_type_error_naming_them():
    with pytest.raises(TypeError, match="entry 'labels'.*list"):
        fingerprint_many({"weights": np.ones(3), "labels": [1, 2, 3]})
    with pytest.raises(TypeError, match="entry 'objects'.*Python objects"):
        fingerprint_many({"objects": np.array([object()])})
    with pytest.raises(TypeError, match="entry 'sparse'.*not dense"):
        fingerprint_many({"sparse": torch.eye(3).to_sparse()})
    with pytest.raises(TypeError, match="meta"):
        fingerprint(torch.empty(3, device="meta"))
    with pytest.raises(TypeError, match="got None"):
        named_items(None)


def test_named_items_accepts_parameters_named_parameters_modules_and_dicts():
    model = torch.nn.Linear(3, 2)
    assert [name for name, _ in named_items(model.parameters())] == ["param_0", "param_1"]
    assert [name for name, _ in named_items(model.named_parameters())] == ["weight", "bias"]
    assert [name for name, _ in named_items(model)] == ["weight", "bias"]
    assert [name for name, _ in named_items({"a": np.ones(1)})] == ["a"]
    assert list(fingerprint_many(model)) == ["weight", "bias"]


def _posted(per_rank: dict[int, dict[str, np.ndarray]], chunk_size: int = SMALL_CHUNK):
    return {rank: {name: fingerprint(value, name=name, chunk_size=chunk_size, stats=False)
                   for name, value in tensors.items()} for rank, tensors in per_rank.items()}


def _payloads(per_rank, posted, requests):
    shipped: dict[int, dict] = {}
    for request in requests:
        shipped.setdefault(request.rank, {})[(request.name, request.chunk)] = chunk_bytes(
            per_rank[request.rank][request.name], posted[request.rank][request.name], request.chunk)
    return shipped


def test_comparison_logic_localises_and_groups():
    base = np.arange(600, dtype=np.float64).reshape(20, 30)
    per_rank = {rank: {"w": base.copy(), "b": np.zeros(3)} for rank in range(5)}
    per_rank[1]["w"][13, 7] = -1
    per_rank[4]["w"][13, 7] = -1
    per_rank[3]["w"][2, 2] = 99
    del per_rank[2]["b"]
    posted = _posted(per_rank)
    mismatches, requests, rehash = compare_fingerprints(posted)
    assert not rehash
    by_name = {m.name: m for m in mismatches}
    assert by_name["b"].kind == "missing" and by_name["b"].outlier_ranks == [2]
    value = by_name["w"]
    assert value.groups == [[0, 2], [1, 4], [3]]
    assert value.ambiguous and value.outlier_ranks == []  # two groups of two: no rank can be blamed
    assert {r.rank for r in requests} == {0, 1, 3}  # one sender per group, never the whole group
    assert localize(value, posted, _payloads(per_rank, posted, requests)) is False
    assert value.first_index == [2, 2] and value.max_abs_diff == 398.0 and value.values == {"0": "62.0", "3": "99.0"}


def test_exchange_budget_marks_diffs_inexact():
    per_rank = {0: {"w": np.zeros(4096)}, 1: {"w": np.ones(4096)}}
    posted = _posted(per_rank, chunk_size=1024)
    mismatches, requests, _ = compare_fingerprints(posted, max_exchange_bytes=4096)
    assert len(requests) == 8 and not mismatches[0].diff_exact and mismatches[0].differing_chunks == 32
    assert localize(mismatches[0], posted, _payloads(per_rank, posted, requests), atol=10) is False


def test_report_round_trips_through_json_dict():
    per_rank = {0: {"w": np.array([1.0, 2.0])}, 1: {"w": np.array([1.0, np.nan])}}
    posted = _posted(per_rank)
    mismatches, requests, _ = compare_fingerprints(posted)
    localize(mismatches[0], posted, _payloads(per_rank, posted, requests))
    report = ConsistencyReport(key="k", consistent=False, world_size=2, mismatches=mismatches)
    data = report.to_dict()
    assert data["mismatches"][0]["max_abs_diff"] == "inf" and data["outlier_ranks"] == []  # 2 ranks: ambiguous
    assert ConsistencyReport.from_dict(data).mismatches[0].first_index == [1]


def test_xxh3_prints_are_unchanged_and_hashed_without_the_gil():
    """The chunk digests are XXH3-64 of each chunk's bytes, pinned: prints stored before still compare equal.

    They are computed through ``xxhash.xxh3_64(...)`` (which releases the GIL while it reads) rather than the
    one-shot ``xxh3_64_intdigest`` (which holds it); both give the same value.
    """
    import xxhash

    array = np.arange(3_000_000, dtype=np.float32)
    fp = fingerprint(array, algorithm="xxh3")
    raw = memoryview(array.view(np.uint8))
    step = fp.chunk_elems * 4
    assert [int(c) for c in fp.chunks] == [xxhash.xxh3_64_intdigest(raw[a:a + step]) for a in range(0, len(raw), step)]
    assert fp.digest == "e1b6900425d9f1f6"  # the value the one-shot function gave
    assert [f"{int(c):016x}" for c in fp.chunks] == ["31914c87a951ba3d", "e3368bf6b89dad76", "70c81b9748700dff"]
