"""The NCCL path: the same gloo victim on NCCL, one GPU per rank (skipped without 2 GPUs).

NCCL refuses two ranks on one GPU, so a skipped collective needs two
devices. Flight Recorder entries read ``nccl:all_reduce`` and the matcher
treats them like gloo's.
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs 2 CUDA devices (NCCL refuses two ranks on one GPU)")


def test_nccl_skipped_collective_names_rank_1(ray_cluster):
    from raysleuth.collectives import collect_collectives
    from victims.record_collective_dumps import job_started, start_job

    driver = start_job("skip", ray_cluster.address, world_size=2, backend="nccl", linger=120)
    try:
        job, _ = job_started(driver)
        time.sleep(12)
        report = collect_collectives(ray_cluster.address, job=job, wait=8)
    finally:
        driver.kill()
        driver.wait()
    assert [(c.rank, c.kind) for c in report.culprits] == [(1, "skipped")], report.verdict.summary
