"""The CUDA paths on a real GPU: fingerprints computed on the device, CUDA memory
readings, a memory breakpoint's CUDA snapshot, and NCCL's Flight Recorder.

Skipped without CUDA (CI has none). None of these needs a Ray cluster, so on a
GPU machine without Ray they run as
``python -m pytest --noconftest -p no:cacheprovider tests/test_cuda.py``.
NCCL refuses two ranks on one GPU: the two-rank fault is ``test_collectives_nccl``.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

MiB = 1024**2


@pytest.fixture(scope="module", autouse=True)
def _home(tmp_path_factory):
    """A home of its own where no cluster is connected (the local run), as a plain script would have."""
    from raysleuth import runtime

    saved = os.environ.get("RAYSLEUTH_HOME")
    if saved is None:
        os.environ["RAYSLEUTH_HOME"] = str(tmp_path_factory.mktemp("home"))
        runtime.reload_settings()
    yield
    if saved is None:
        os.environ.pop("RAYSLEUTH_HOME", None)
        runtime.reload_settings()


def test_fingerprint_on_the_device_matches_the_cpu_and_sees_one_flipped_bit():
    from raysleuth import fingerprint

    tensor = torch.randn(3 * MiB + 5, device="cuda").to(torch.bfloat16)
    print_ = fingerprint(tensor)
    assert print_.device == "cuda:0" and print_.algorithm == "mix64"
    assert print_.digest == fingerprint(tensor.cpu(), algorithm="mix64").digest  # a CPU rank and a GPU rank compare
    flipped = tensor.clone()
    flipped.view(torch.int16)[2 * MiB + 1] ^= 1
    other = fingerprint(flipped)
    assert other.digest != print_.digest
    differing = [i for i, (a, b) in enumerate(zip(print_.chunks, other.chunks)) if a != b]
    assert differing == [(2 * MiB + 1) // print_.chunk_elems]  # which chunk holds the flipped element
    tensor[7] = float("nan")
    on_device, on_host = fingerprint(tensor, stats=True).stats, fingerprint(tensor.cpu(), stats=True).stats
    assert on_device.nan_count == 1 and on_device.count == tensor.numel()
    for field, expected in vars(on_host).items():
        assert getattr(on_device, field) == pytest.approx(expected, rel=1e-9), field


def test_memory_sample_follows_cuda_allocations():
    from raysleuth.memory import read_sample

    torch.cuda.init()
    torch.cuda.synchronize()
    base = read_sample()["cuda_allocated_bytes"]
    held = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    sample = read_sample()
    assert sample["cuda_allocated_bytes"] - base >= 256 * MiB
    assert sample["cuda_peak_bytes"] >= sample["cuda_allocated_bytes"]
    assert sample["cuda_devices"][0]["allocated_bytes"] >= 256 * MiB
    del held
    assert read_sample()["cuda_allocated_bytes"] - base < MiB


def _train_step(threshold: float) -> bool:
    from raysleuth import memory_breakpoint

    return memory_breakpoint(threshold, action="capture", name="cuda-memory-test")


def test_memory_breakpoint_on_cuda_captures_a_snapshot_that_names_the_allocating_line():
    from raysleuth import runtime
    from raysleuth.recorder import get_client, open_store

    torch.cuda.init()
    base = torch.cuda.memory_allocated()
    held, fired = [], []
    for _ in range(4):
        held.append(torch.ones(48 * MiB, dtype=torch.uint8, device="cuda"))  # the leak
        fired.append(_train_step(base + 100 * MiB))
    assert fired == [False, False, True, False]  # at the 3rd step (144 MiB), once per call site
    get_client().flush(timeout=5.0)
    store = open_store(home=runtime.settings().home)
    capsules = store.query("memory_capsule", name="cuda-memory-test")
    assert len(capsules) == 1
    capsule = capsules[0].data
    assert capsule["metric"] == "cuda_allocated_bytes" and capsule["value_bytes"] >= base + 144 * MiB
    assert capsule["cuda_snapshot_skipped"] is None, capsule["cuda_snapshot_skipped"]
    snapshot = capsule["cuda_snapshot"]
    assert snapshot and os.path.getsize(snapshot) > 0
    with open(snapshot, "rb") as file:  # read as bytes, never unpickled: the stacks are plain strings inside
        raw = file.read()
    assert b"test_memory_breakpoint_on_cuda_captures_a_snapshot" in raw and b"test_cuda.py" in raw
    assert capsule["stack"] and capsule["stack"][-1]["function"] == "_train_step"  # the line that checked
    store.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_nccl_flight_recorder_entries_are_read_and_aligned():
    """One rank on NCCL (the most one GPU allows): every all_reduce is in the dump, completed, with its line."""
    import torch.distributed as dist

    from raysleuth import collectives
    from raysleuth.collectives.hook import set_detail
    from raysleuth.collectives.model import entries_from_dump
    from raysleuth.collectives.record import snapshot

    collectives.install()  # as raysleuth's worker setup does, before the process group exists
    set_detail(True)  # full mode's detail: each call's file:line (light mode keeps it only for calls still running)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                            device_id=torch.device("cuda:0"))
    try:
        tensor = torch.ones(1024, 1024, device="cuda")
        for _ in range(5):
            dist.all_reduce(tensor)  # the line each entry names
        line = _line_of("dist.all_reduce(tensor)  # the line")
        torch.cuda.synchronize()
        deadline = time.monotonic() + 10
        while True:
            data = snapshot("test")
            entries = entries_from_dump(data).get("0", {})
            if (len(entries) >= 5 and all(e.state == "completed" for e in entries.values())) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        names = [e.get("profiling_name") for e in (data["flight_recorder"] or {}).get("entries") or []]
        assert names.count("nccl:all_reduce") >= 5, names
        seqs = sorted(entries)[-5:]
        assert [entries[s].op for s in seqs] == ["all_reduce"] * 5
        assert all(entries[s].state == "completed" for s in seqs), [entries[s].state for s in seqs]
        assert all(entries[s].inputs == [[[1024, 1024], "float32"]] for s in seqs), entries[seqs[-1]].inputs
        assert all(entries[s].file.endswith("test_cuda.py") and entries[s].line == line for s in seqs)
        assert data["rank"] == 0 and data["world_size"] == 1
    finally:
        set_detail(False)
        dist.destroy_process_group()


def _line_of(text: str) -> int:
    with open(__file__) as file:
        return next(number for number, line in enumerate(file, 1) if text in line and "_line_of" not in line)
