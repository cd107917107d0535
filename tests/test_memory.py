"""Memory on a real 2-node Ray: one leaking rank of four, threshold capsules, agent sampling, the CLI."""

from __future__ import annotations

import json
import time

import pytest

MiB = 1024 * 1024


def _store(ray_cluster):
    from raysleuth import cluster
    from raysleuth.recorder import open_store

    return open_store(cluster.session_name(), home=ray_cluster.home)


def test_one_leaking_rank_of_four_is_the_only_one_flagged(ray_cluster, capsys, monkeypatch):
    import ray

    from raysleuth import cli
    from raysleuth.memory import memory_report
    from raysleuth.recorder import blocks
    from victims.memory_actors import MemoryWorker

    started = time.time()
    behaviours = ["flat", "noisy", "leak", "flat"]
    workers = [MemoryWorker.options(name=f"memtest_rank{rank}").remote(rank, b) for rank, b in enumerate(behaviours)]
    try:
        results = ray.get([w.run.remote(steps=45, step_seconds=0.06, interval=0.05) for w in workers], timeout=120)
    finally:
        for worker in workers:
            ray.kill(worker)
    for result in results:
        assert result["flushed"] and result["errors"] == 0
        assert result["samples"] >= 30, result
    store = _store(ray_cluster)
    report = memory_report(store, rank=[0, 1, 2, 3])
    ours = {r["pid"] for r in results}  # the shared cluster's run holds other modules' ranks 0-3 too
    # the writer sealed these samples into blocks (RAYSLEUTH_SEAL_ROWS=64 on this cluster), and the verdicts read
    # from them are the rows' own
    assert blocks.top(store) and any(sender for sender, *_ in blocks.read(store, blocks.top(store)))
    with monkeypatch.context() as patch:
        patch.setattr(blocks, "top", lambda store: 0)
        by_rows = memory_report(store, rank=[0, 1, 2, 3], since=started)
    assert memory_report(store, rank=[0, 1, 2, 3], since=started).to_dict() == by_rows.to_dict()
    by_rank = {w.rank: w for w in report.workers if w.pid in ours}
    assert sorted(by_rank) == [0, 1, 2, 3]
    assert [w.rank for w in report.leaks if w.pid in ours] == [2], [(w.rank, w.reason) for w in by_rank.values()]
    leaker = by_rank[2]
    assert leaker.source == "watch" and leaker.samples >= 30
    # 2 MiB appended per step: the per-step slope says so; per second it is 2 MiB / (~0.06-0.1 s)
    assert 1.5 * MiB < leaker.slope_bytes_per_step < 2.5 * MiB, leaker.evidence
    assert 8 * MiB < leaker.slope_bytes_per_s < 45 * MiB, leaker.evidence
    assert leaker.evidence["r2"] >= 0.8 and leaker.evidence["growth_bytes"] > 40 * MiB
    noisy = by_rank[1]
    assert noisy.samples >= 30 and not noisy.leak, noisy.evidence
    # samples carry rank and step, tagged by the recorder client
    steps = [r.step for r in store.query("memory", rank=2) if r.pid == leaker.pid]
    assert max(s for s in steps if s is not None) >= 40

    code = cli.main(["memory", "--json", "--run", str(store.path), "--home", str(ray_cluster.home)])
    payload = json.loads(capsys.readouterr().out)
    assert code == 1
    flagged = [w["rank"] for w in payload["workers"] if w["leak"] and w["pid"] in {r["pid"] for r in results}]
    assert flagged == [2]
    entry = next(w for w in payload["workers"] if w["rank"] == 2 and w["pid"] == leaker.pid)
    for key in ("rank", "pid", "node_ip", "samples", "rss_bytes", "uss_bytes", "cuda_allocated_bytes", "peak_bytes",
                "slope_bytes_per_s", "leak", "evidence"):
        assert key in entry
    # the shared run holds other modules' rank-1 workers (some with too few samples to judge): --since scopes
    window = f"{time.time() - started + 1:.0f}s"
    code = cli.main(["memory", "--run", str(store.path), "--home", str(ray_cluster.home), "--rank", "1",
                     "--since", window])
    text = capsys.readouterr().out
    assert code == 0 and "no leak" in text and ("▁" in text or "█" in text), text
    assert str(noisy.pid) in text
    store.close()


def test_threshold_trigger_fires_once_and_leaves_a_capsule(ray_cluster):
    import raysleuth as rs
    from raysleuth.memory import read_sample
    from raysleuth.recorder import get_client

    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)  # earlier modules' freed heap would take the new bytes without RSS growing
    base = read_sample()["rss_bytes"]
    trigger = rs.memory.on_threshold(base + 40 * MiB, "capture", interval=0.05, name="test-threshold")
    try:
        assert not trigger.fired
        held = [b"h" * (30 * MiB), b"h" * (30 * MiB)]
        deadline = time.time() + 20
        while not trigger.fired and time.time() < deadline:
            time.sleep(0.05)
        assert trigger.fired and trigger.value_bytes >= base + 40 * MiB
        held.append(b"h" * (40 * MiB))  # crossing further does not fire again
        time.sleep(0.4)
    finally:
        trigger.cancel()
        rs.memory.stop()
    assert get_client().flush(timeout=30)
    store = _store(ray_cluster)
    capsules = store.query("memory_capsule", name="test-threshold")
    assert len(capsules) == 1
    capsule = capsules[0].data
    assert capsule["threshold_bytes"] == base + 40 * MiB
    assert any("test_threshold_trigger_fires_once" in frame["function"]
               for frames in capsule["threads"].values() for frame in frames)
    top = capsule["holders"][0]
    assert top["bytes"] >= 60 * MiB and "held" in top["owner"], capsule["holders"]
    assert capsule["recent_samples"] and capsule["recent_samples"][-1]["rss_bytes"] >= base
    assert capsule["cuda_snapshot"] is None and "CUDA" in capsule["cuda_snapshot_skipped"]
    assert capsules[0].level == "WARNING"
    del held
    store.close()


def test_memory_breakpoint_captures_once_per_call_site(ray_cluster):
    import raysleuth as rs
    from raysleuth.recorder import get_client

    fired = [rs.memory_breakpoint(1024, action="capture", name="test-inline") for _ in range(3)]
    assert fired == [True, False, False]
    assert rs.memory_breakpoint(1 << 50, action="capture") is False  # far above: never fires
    assert get_client().flush(timeout=30)
    store = _store(ray_cluster)
    capsules = store.query("memory_capsule", name="test-inline")
    assert len(capsules) == 1
    stack = capsules[0].data["stack"]
    assert stack[-1]["function"] == "<listcomp>" or "test_memory_breakpoint" in stack[-1]["function"] or any(
        "test_memory_breakpoint" in f["function"] for f in stack)
    store.close()


def test_agents_sample_a_worker_that_imports_nothing_from_raysleuth(ray_cluster, capsys):
    import ray

    from raysleuth import cli
    from victims.memory_actors import PlainGrower

    grower = PlainGrower.options(name="plaingrower_rank7").remote()
    try:
        pid = ray.get(grower.start.remote(1, 0.04, 400), timeout=60)
        code = cli.main(["memory", "--sample", "5s", "--interval", "0.1", "--address", ray_cluster.address,
                         "--home", str(ray_cluster.home), "--json", "--rank", "7"])
        payload = json.loads(capsys.readouterr().out)
        assert ray.get(grower.imported_raysleuth.remote(), timeout=30) is False
    finally:
        ray.get(grower.stop.remote(), timeout=30)
        ray.kill(grower)
    workers = [w for w in payload["workers"] if w["pid"] == pid]
    assert len(workers) == 1, payload
    worker = workers[0]
    assert worker["rank"] == 7 and worker["source"] == "agent" and worker["actor_name"] == "plaingrower_rank7"
    assert worker["samples"] >= 10 and worker["uss_bytes"] > 0
    assert worker["leak"], worker["evidence"]
    assert code == 1
