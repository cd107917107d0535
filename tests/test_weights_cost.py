"""Where a sync's digests run (what bench/bench_weights.py times), and prints that stay what they were.

Prints are compared across processes and with records already stored, so a
change to how (or on which thread) a tensor is digested must give the very
same digests: they are pinned here, on data made by integer arithmetic (the
same on every machine).
"""

from __future__ import annotations

import threading

import pytest
import torch

from raysleuth.weights.prints import print_tensor
from raysleuth.weights.stream import OVERLAP_MIN_BYTES, SyncSide, pass_through


def _data(n: int, dtype: torch.dtype) -> torch.Tensor:
    return ((torch.arange(n, dtype=torch.int64) * 2654435761) % 65521 - 32760).to(dtype)


PINNED = {  # name: (whole digest, chunk digests, digest at bfloat16 or None)
    "bf16 two chunks": ("a1a886cac4b70295", ("82c6ea3d3aa16ac5", "dd60ac1d503b2b82"), None),
    "fp32 partial last chunk": ("0f36115323265b53", ("22e28be1837d0b2c", "6fd3cfc9ea50832f"), "a5b7f9a16e0f0729"),
    "transposed": ("2a7e53b12f9ea19b", ("c96f46c5b6b6eeba",), "58dfe81a5423c31b"),
    "int8": ("0c8c423d1b698c1e", ("668d048d50e358da",), None),
    "0-d": ("38e5c6da242ff077", ("02bbe3a81888277b",), "57c55ec3ffbd993f"),
    "empty": ("891512ea9741936c", (), "e44e5fd730c32e29"),
    "parameter": ("a3ea5b7ed3e502f4", ("cb443f8ca84228f5",), "7f6e4008554131b9"),
    "view into a bucket": ("aa383a8b6c84960c", ("9de658f1edf075fa",), None),
}


def _cases() -> dict[str, torch.Tensor]:
    return {
        "bf16 two chunks": _data(1024 * 4096, torch.bfloat16).view(1024, 4096),
        "fp32 partial last chunk": _data(1024 * 1024 + 3, torch.float32),
        "transposed": (_data(64 * 48, torch.float32).view(64, 48) / 3).t(),
        "int8": _data(1000, torch.int8),
        "0-d": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "parameter": torch.nn.Parameter(_data(256, torch.float32).view(16, 16) / 5),
        "view into a bucket": _data(3 * 4096 + 100, torch.bfloat16)[100:100 + 2 * 4096].view(2, 4096),
    }


@pytest.mark.parametrize("side", ["sent", "received"])
def test_prints_are_pinned_on_both_sides_whatever_thread_digests_them(side):
    cases = _cases()
    stream = SyncSide(side, 3, canonical="bfloat16")
    assert [name for name, _ in pass_through(list(cases.items()), stream)] == list(cases)
    got = {p.name: (p.digest, tuple(p.chunks), p.canonical["digest"] if p.canonical else None)
           for p in stream.prints}
    assert got == PINNED
    assert {name: print_tensor(name, t, canonical="bfloat16").digest for name, t in cases.items()} == \
        {name: pin[0] for name, pin in PINNED.items()}


def test_only_big_cpu_tensors_leave_the_senders_thread():
    """A small tensor is digested where it is seen (a hand-off would only add a wait for the GIL)."""
    threads: dict[str, str] = {}
    side = SyncSide("sent", 4)
    digest = side._digest

    def spy(name, tensor):
        threads[name] = threading.current_thread().name
        return digest(name, tensor)

    side._digest = spy  # type: ignore[method-assign]  (records the thread, then digests as before)
    big = torch.zeros(OVERLAP_MIN_BYTES // 4, dtype=torch.float32)
    items = [("norm", torch.ones(4096, dtype=torch.bfloat16)), ("matrix", big), ("bias", torch.ones(16))]
    assert list(pass_through(items, side)) == items
    caller = threading.current_thread().name
    assert threads["norm"] == threads["bias"] == caller
    assert threads["matrix"].startswith("raysleuth-weights")
    assert [p.name for p in side.prints] == ["norm", "matrix", "bias"] and side.pending is None

    received = SyncSide("received", 4)
    received._digest = spy  # type: ignore[method-assign]
    list(pass_through([("matrix2", big)], received))
    assert threads["matrix2"] == caller  # the receiver digests inline, before the loader sees the tensor
