"""Consistency never answers wrongly in silence: algorithm labels, incomparable digests, bounded meetings.

Pure tests first (no Ray); then torch.distributed gloo on CPU (two real
processes) for the bounded meeting, then the session Ray cluster for a
driver-side compare across ranks with and without ``xxhash``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from raysleuth.consistency.report import ConsistencyReport, compare_fingerprints
from raysleuth.fingerprints import fingerprint

fp_module = sys.modules["raysleuth.fingerprints.digest"]  # where the hash is chosen
DATA = np.arange(100_000, dtype=np.float32)


def test_label_names_the_real_algorithm(monkeypatch):
    assert fingerprint(DATA).algorithm == "xxh3"
    monkeypatch.setattr(fp_module, "_xxhash", None)  # a rank where xxhash is not installed
    without = fingerprint(DATA)
    assert without.algorithm == "blake2b"
    with pytest.raises(ValueError, match="xxhash"):
        fingerprint(DATA, algorithm="xxh3")


def test_mix64_digest_does_not_depend_on_xxhash(monkeypatch):
    with_xxhash = fingerprint(DATA, algorithm="mix64").digest
    monkeypatch.setattr(fp_module, "_xxhash", None)
    assert fingerprint(DATA, algorithm="mix64").digest == with_xxhash


def test_two_algorithms_are_incomparable_not_a_mismatch(monkeypatch):
    xxh3 = fingerprint(DATA, name="w")
    monkeypatch.setattr(fp_module, "_xxhash", None)
    blake = fingerprint(DATA, name="w")
    mismatches, requests, rehash = compare_fingerprints({0: {"w": xxh3}, 1: {"w": blake}})
    assert mismatches == [] and requests == [] and rehash == ["w"]
    report = ConsistencyReport(key="params", consistent=False, world_size=2, tensors_checked=1,
                               arrived_ranks=[0, 1], incomparable=["w"])
    assert "INCOMPARABLE" in report.summary() and "MISMATCH" not in report.summary()
    again = ConsistencyReport.from_dict(report.to_dict())
    assert again.incomparable == ["w"]


def test_default_fingerprint_is_bitwise_only_and_stats_on_request():
    assert fingerprint(DATA).stats is None
    assert fingerprint(DATA, stats=True).stats.count == DATA.size


def test_fingerprint_stays_callable_after_compare_is_touched():
    script = ("import numpy as np, raysleuth as rs\nrs.compare\nimport raysleuth.consistency, raysleuth.redaction\n"
              "print(rs.fingerprint(np.ones(3)).algorithm, rs.redact('api_key', 'x'))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["xxh3", "<redacted>"]


# ------------------------------------------------------------------ torch.distributed, bounded

_GLOO_RANK = r"""
import json, sys, time
import numpy as np, torch, torch.distributed as dist
from raysleuth.consistency import check_distributed_consistency
rank, store_path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
w = {"w": torch.arange(1000, dtype=torch.float32)}
first = check_distributed_consistency(w, key="both", timeout=30, transport="torch", record=False)
result = {"both": [first.consistent, first.arrived_ranks, first.transport]}
if rank == 0:
    started = time.monotonic()
    alone = check_distributed_consistency(w, key="alone", timeout=3, transport="torch", record=False)
    result["alone"] = [alone.consistent, alone.missing_ranks, round(time.monotonic() - started, 1)]
else:
    time.sleep(12)  # rank 1 never joins the second check
open(out, "w").write(json.dumps(result))
import os; os._exit(0)
"""


def test_torch_distributed_meeting_has_a_timeout(tmp_path):
    from gloo_ranks import run_two_ranks

    results = run_two_ranks(_GLOO_RANK, tmp_path)
    assert isinstance(results[0], dict), results
    assert results[0]["both"] == [True, [0, 1], "torch.distributed"], results
    consistent, missing, seconds = results[0]["alone"]
    assert not consistent and missing == [1] and seconds < 10, results[0]


# ------------------------------------------------------------------ Ray: ranks with and without xxhash


class Holder:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.weight = np.arange(50_000, dtype=np.float32)

    def drop_xxhash(self) -> str:
        import raysleuth.fingerprints.digest as module

        module._xxhash = None  # this rank's environment lacks xxhash
        return fingerprint(self.weight).algorithm


def test_compare_across_ranks_with_and_without_xxhash(ray_cluster):
    import ray

    import raysleuth as rs

    actor = ray.remote(num_cpus=0)(Holder)
    handles = [actor.remote(rank) for rank in range(2)]
    try:
        assert ray.get(handles[1].drop_xxhash.remote(), timeout=120) == "blake2b"
        same = rs.compare(handles, lambda self: self.weight, record=False)
        assert same.consistent and not same.mismatches and not same.incomparable, same.summary()

        def differs(self):
            weight = self.weight.copy()
            if self.rank == 1:
                weight[7] += 1
            return weight

        diff = rs.compare(handles, differs, record=False)
        [mismatch] = diff.mismatches
        assert mismatch.kind == "value" and mismatch.ambiguous and mismatch.outlier_ranks == []
        assert mismatch.first_index == [7]
    finally:
        for handle in handles:
            ray.kill(handle)
