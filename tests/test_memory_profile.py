"""Model profiles, MemoryProfiler and MemoryBufferManager on real torch (no Ray needed)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

MiB = 1024 * 1024


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 16)
        self.hidden = torch.nn.Linear(16, 32)
        self.norm = torch.nn.BatchNorm1d(32)  # buffers: running_mean, running_var, num_batches_tracked
        self.head = torch.nn.Linear(32, 4, bias=False).to(torch.float64)

    def forward(self, tokens):
        x = self.norm(torch.relu(self.hidden(self.embed(tokens))))
        return self.head(x.double())


def _trained(optimizer_steps: int = 1):
    torch.manual_seed(0)
    model = Small()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(optimizer_steps):
        loss = model(torch.randint(0, 100, (8,))).sum()
        loss.backward()
        optimizer.step()
    return model, optimizer


def test_profile_matches_exact_bytes_of_params_grads_buffers_and_adam_state(raysleuth_home):
    from raysleuth import profile_memory_usage

    model, optimizer = _trained()
    parameters = (100 * 16 + 16 * 32 + 32) * 4 + (32 + 32) * 4 + 32 * 4 * 8
    buffers = 32 * 4 + 32 * 4 + 8  # running mean/var float32, num_batches_tracked int64
    # Adam keeps exp_avg and exp_avg_sq (same size as the parameter) and a float32 scalar step per parameter
    adam = 2 * parameters + 4 * len(list(model.parameters()))
    profile = profile_memory_usage(model, top_n=10, optimizer=optimizer)
    assert profile.parameters_bytes == parameters
    assert profile.gradients_bytes == parameters
    assert profile.buffers_bytes == buffers
    assert profile.optimizer_bytes == adam
    assert profile.total_bytes == 4 * parameters + buffers + 4 * len(list(model.parameters()))
    by_name = {m.name: m for m in profile.modules}
    assert by_name["embed"].parameters_bytes == 100 * 16 * 4
    assert by_name["head"].parameters_bytes == 32 * 4 * 8 and by_name["head"].gradients_bytes == 32 * 4 * 8
    assert by_name["norm"].buffers_bytes == buffers
    assert profile.modules[0].name == "embed"  # the biggest holder first
    assert sum(m.total_bytes for m in profile.modules) == profile.total_bytes
    assert len(profile_memory_usage(model, top_n=2).modules) == 2
    json.dumps(profile.to_dict())


def test_profile_without_optimizer_or_grads():
    from raysleuth import profile_memory_usage

    model = Small()
    profile = profile_memory_usage(model)
    assert profile.gradients_bytes == 0 and profile.optimizer_bytes == 0
    tied = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False))
    tied[1].weight = tied[0].weight
    assert profile_memory_usage(tied).parameters_bytes == 4 * 4 * 4  # shared weight counted once


def test_trend_form_writes_every_interval_steps(raysleuth_home, tmp_path):
    from raysleuth import profile_memory_usage
    from raysleuth.memory import MemoryTrend

    model, optimizer = _trained()
    batch = torch.randint(0, 100, (8,))
    out = tmp_path / "memory_profile.json"
    trend = profile_memory_usage(model, batch, interval=5, output_file=str(out))
    assert isinstance(trend, MemoryTrend)
    for step in range(23):
        trend(step)
    written = json.loads(out.read_text())
    assert [s["step"] for s in written["samples"]] == [0, 5, 10, 15, 20]
    assert written["batch_bytes"] == 8 * 8 and written["interval"] == 5
    assert written["samples"][0]["model_parameters_bytes"] == profile_memory_usage(model).parameters_bytes
    assert written["samples"][0]["rss_bytes"] > 0
    assert "leak" in written


def test_memory_profiler_detects_a_leak_and_writes_html(raysleuth_home, tmp_path):
    from raysleuth import MemoryProfiler

    import tracemalloc

    was_tracing = tracemalloc.is_tracing()
    with MemoryProfiler(model=Small(), track_allocations=True, leak_detection=True) as profiler:
        hoard = []
        for i in range(12):
            hoard.append(b"p" * (4 * MiB))
            profiler.take_snapshot(f"step{i}")
    assert tracemalloc.is_tracing() == was_tracing  # the tracing it started is stopped
    # the hoard is seen whether USS moved or the allocator reused pages this process had freed before
    assert profiler.leak_detected, profiler.leak_verdict
    assert profiler.leak_verdict.slope_bytes_per_s > 0
    growth = profiler.snapshots[-1]["allocation_growth"]
    assert growth and growth[0]["size_diff_bytes"] >= 30 * MiB and "test_memory_profile.py" in growth[0]["where"]
    page = profiler.generate_report(tmp_path / "x.html").read_text()
    assert "<svg" in page and "<polyline" in page and "LEAK" in page
    assert "<script src=" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    del hoard
    flat = MemoryProfiler(track_allocations=False)
    for i in range(12):
        flat.take_snapshot()
    assert not flat.leak_detected


def test_buffer_manager_measures_the_peak_and_warns_over_budget(raysleuth_home, caplog):
    from raysleuth import MemoryBufferManager

    with MemoryBufferManager(budget_bytes=None, name="small") as small:
        pass
    import mmap

    with MemoryBufferManager(budget_bytes=1, name="big-block") as block:
        # Mapped and touched, then unmapped: RSS rises and falls whatever the allocator kept from earlier modules
        spike = mmap.mmap(-1, 64 * MiB)
        spike.write(b"s" * (64 * MiB))
        spike.close()  # freed before the block ends: only the peak remembers it
    assert block.peak_increase_bytes >= 60 * MiB, (block.start_bytes, block.peak_bytes)
    assert block.end_bytes < block.peak_bytes
    assert block.over_budget and not small.over_budget
    assert any("big-block" in r.getMessage() and "over its budget" in r.getMessage() for r in caplog.records)
