"""A check that compared nothing is never "consistent", and a tie names no rank.

Two real ranks meet over torch.distributed (gloo on CPU, two processes): a
gradient check before ``backward()``, ZeRO-style parameters without ``.grad``
and an exhausted ``parameters()`` generator compare 0 tensors, which is a
warning state of its own (the record's level is ``WARNING``, the CLI exits 1),
and two ranks that differ are "ambiguous", with no outlier named. The pure
comparison logic is tested on fingerprints alone.
"""

from __future__ import annotations

import json

import numpy as np

from raysleuth.consistency.report import ConsistencyReport, compare_fingerprints
from raysleuth.fingerprints import fingerprint

_GLOO_RANK = r"""
import json, os, sys
import torch, torch.distributed as dist
import raysleuth as rs
from raysleuth.consistency import check_distributed_consistency, check_gradient_sync
rank, store_path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
rs.set_rank(rank, 2)
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
result = {}
before = check_gradient_sync(model.parameters(), key="before-backward", timeout=30, transport="torch")
result["before"] = [before.consistent, before.nothing_compared, before.level, before.summary()]
params = model.parameters()
list(params)  # the generator is spent: the check gets nothing
spent = check_distributed_consistency(params, key="spent", timeout=30, transport="torch", record=False)
result["spent"] = [spent.consistent, spent.nothing_compared]
with torch.no_grad():
    model.weight[0, 0] += rank  # rank 1 differs: with two ranks, which one is wrong is not known
split = check_distributed_consistency(model.named_parameters(), key="split", timeout=30, transport="torch",
                                      record=False)
result["split"] = [split.consistent, split.to_dict()["mismatches"], split.outlier_ranks, split.summary()]
rs.flush(timeout=10)
open(out, "w").write(json.dumps(result))
os._exit(0)
"""


def test_nothing_compared_over_gloo_is_a_warning_and_a_tie_names_no_rank(tmp_path, capsys):
    from gloo_ranks import run_two_ranks

    results = run_two_ranks(_GLOO_RANK, tmp_path, RAYSLEUTH_HOME=str(tmp_path / "home"))
    assert all(isinstance(result, dict) for result in results), results
    for result in results:
        consistent, nothing, level, summary = result["before"]
        assert not consistent and nothing and level == "WARNING" and "NOTHING COMPARED" in summary, result
        assert result["spent"] == [False, True]
        consistent, [mismatch], outliers, summary = result["split"]
        assert not consistent and mismatch["ambiguous"] and mismatch["outlier_ranks"] == [] and outliers == []
        assert "ambiguous: ranks [0] vs [1]" in summary, summary
    from raysleuth.cli import main

    capsys.readouterr()
    code = main(["consistency", "--home", str(tmp_path / "home")])
    out = capsys.readouterr().out
    assert code == 1 and "nothing compared" in out and "NOTHING COMPARED" in out, out
    code = main(["consistency", "--home", str(tmp_path / "home"), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["latest_consistent"] is False and data["checks"][0]["nothing_compared"]


def _posted(per_rank: dict[int, dict[str, np.ndarray]]) -> dict:
    return {rank: {name: fingerprint(value, name=name) for name, value in tensors.items()}
            for rank, tensors in per_rank.items()}


def test_ties_are_ambiguous_and_a_clear_majority_names_the_outlier():
    same, other = np.arange(10.0), np.arange(10.0) + 1
    cases = {
        "two ranks": ({0: same, 1: other}, True, [[0], [1]]),
        "even split": ({0: same, 1: other, 2: same, 3: other}, True, [[0, 2], [1, 3]]),
        "three way": ({0: same, 1: other, 2: same * 3}, True, [[0], [1], [2]]),
        "majority": ({0: same, 1: same, 2: other}, False, [[0, 1], [2]]),
    }
    for label, (values, ambiguous, groups) in cases.items():
        [mismatch], _, _ = compare_fingerprints(_posted({rank: {"w": v} for rank, v in values.items()}))
        assert mismatch.ambiguous is ambiguous and mismatch.groups == groups, label
        assert mismatch.outlier_ranks == ([] if ambiguous else [2]), label
    [shape], _, _ = compare_fingerprints(_posted({0: {"w": same}, 1: {"w": same[:5]}}))
    assert shape.kind == "shape" and shape.ambiguous and shape.outlier_ranks == []
    [missing], _, _ = compare_fingerprints(_posted({0: {"w": same}, 1: {}}))
    assert missing.kind == "missing" and missing.ambiguous and "ambiguous: ranks [0] vs [1]" in missing.describe()
    report = ConsistencyReport(key="k", consistent=False, world_size=2, mismatches=[missing])
    assert report.outlier_ranks == [] and ConsistencyReport.from_dict(report.to_dict()).mismatches[0].ambiguous


def test_a_stored_zero_tensor_pass_reads_back_as_nothing_compared():
    """Checks stored before this state existed said consistent over 0 tensors: read them as the warning."""
    old = {"key": "gradients", "consistent": True, "world_size": 4, "tensors_checked": 0, "arrived_ranks": [0, 1, 2, 3]}
    report = ConsistencyReport.from_dict(old)
    assert not report.consistent and report.nothing_compared and "NOTHING COMPARED" in report.summary()
    fine = ConsistencyReport(key="p", consistent=False, world_size=2, tensors_checked=3, arrived_ranks=[0, 1])
    fine.settle()
    assert fine.consistent and not fine.nothing_compared and fine.level == "INFO"
