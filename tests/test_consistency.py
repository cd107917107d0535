"""Consistency checks on a real Ray cluster: 4 rank actors that diverge in known ways."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import ray
import torch

import raysleuth as rs
from raysleuth.consistency.report import ConsistencyReport

WORLD = 4


@pytest.fixture(scope="module")
def ranks(ray_cluster):
    from victims.diverged_ranks import DataParallelRank

    actor = ray.remote(num_cpus=0)(DataParallelRank)
    handles = [actor.remote(rank, WORLD) for rank in range(WORLD)]
    assert ray.get([h.rank_of.remote() for h in handles], timeout=120) == list(range(WORLD))
    yield handles
    for handle in handles:
        ray.kill(handle)


def run_all(handles, method, *args, **kwargs):
    return ray.get([getattr(h, method).remote(*args, **kwargs) for h in handles], timeout=120)


def test_identical_ranks_are_consistent(ranks):
    reports = run_all(ranks, "check", "same")
    for rank, report in enumerate(reports):
        assert report["consistent"], report
        assert report["rank"] == rank and report["world_size"] == WORLD
        assert report["arrived_ranks"] == [0, 1, 2, 3] and report["tensors_checked"] == 5


def test_perturbed_element_names_tensor_rank_and_index(ranks, ray_cluster):
    ray.get(ranks[2].perturb.remote("2.weight", (3, 17), 1e-3), timeout=60)
    try:
        reports = run_all(ranks, "check", "perturbed")
        assert all(r == reports[0] | {"rank": r["rank"], "seconds": r["seconds"]} for r in reports), \
            "every rank gets the same report"
        report = reports[0]
        assert not report["consistent"]
        [mismatch] = report["mismatches"]
        assert mismatch["name"] == "2.weight" and mismatch["kind"] == "value"
        assert mismatch["outlier_ranks"] == [2] and mismatch["groups"] == [[0, 1, 3], [2]]
        assert mismatch["first_index"] == [3, 17]
        assert mismatch["max_abs_diff"] == pytest.approx(1e-3, rel=1e-2) and mismatch["diff_exact"]
        assert set(mismatch["values"]) == {"0", "2"}
    finally:
        run_all(ranks, "restore")

    # stored once, by the lowest rank, as kind "consistency"
    deadline = time.time() + 30
    records = []
    while time.time() < deadline and not records:
        run_all(ranks, "flush_evidence")
        store = rs.open_store(home=ray_cluster.home)
        records = store.query("consistency", name="perturbed")
        store.close()
        time.sleep(0.2)
    assert len(records) == 1 and records[0].rank == 0 and records[0].level == "ERROR"
    stored = ConsistencyReport.from_dict(records[0].data)
    assert stored.mismatches[0].first_index == [3, 17]


def test_unnamed_parameters_are_named_by_position(ranks):
    ray.get(ranks[1].perturb.remote("0.bias", (5,), 0.25), timeout=60)
    try:
        report = run_all(ranks, "check_parameters", "unnamed")[3]
    finally:
        run_all(ranks, "restore")
    [mismatch] = report["mismatches"]
    assert mismatch["name"] == "param_1" and mismatch["outlier_ranks"] == [1] and mismatch["first_index"] == [5]


def test_missing_shape_and_dtype_mismatches(ranks):
    ray.get([
        ranks[0].set_extra.remote("only_some", torch.zeros(3)),
        ranks[1].set_extra.remote("only_some", torch.zeros(3)),
        ranks[2].set_extra.remote("only_some", torch.zeros(3)),
        ranks[3].set_extra.remote("buffer", torch.arange(101, dtype=torch.float32)),
        ranks[0].set_extra.remote("cast", torch.ones(4, dtype=torch.bfloat16)),
        ranks[1].set_extra.remote("cast", torch.ones(4, dtype=torch.float16)),
        ranks[2].set_extra.remote("cast", torch.ones(4, dtype=torch.bfloat16)),
        ranks[3].set_extra.remote("cast", torch.ones(4, dtype=torch.bfloat16)),
    ], timeout=60)
    try:
        report = run_all(ranks, "check", "kinds")[1]
    finally:
        ray.get([h.set_extra.remote(name, None) for h in ranks for name in ("only_some", "cast")]
                + [ranks[3].set_extra.remote("buffer", torch.arange(100, dtype=torch.float32))], timeout=60)
    kinds = {m["name"]: m for m in report["mismatches"]}
    assert set(kinds) == {"only_some", "buffer", "cast"}
    assert kinds["only_some"]["kind"] == "missing" and kinds["only_some"]["outlier_ranks"] == [3]
    assert kinds["buffer"]["kind"] == "shape" and kinds["buffer"]["outlier_ranks"] == [3]
    assert kinds["cast"]["kind"] == "dtype" and kinds["cast"]["outlier_ranks"] == [1]
    assert "float16" in kinds["cast"]["detail"]


def test_rank_that_never_arrives_is_reported_missing_with_timeout(ranks):
    started = time.monotonic()
    reports = run_all(ranks[:3], "check", "absent", timeout=10)
    assert time.monotonic() - started < 60
    for report in reports:
        assert not report["consistent"]
        assert report["missing_ranks"] == [3] and report["arrived_ranks"] == [0, 1, 2]
        assert report["timeout"] == 10 and report["mismatches"] == []


def test_gradient_sync_catches_skipped_allreduce(ranks):
    run_all(ranks, "train_step", WORLD)
    good = run_all(ranks, "check_gradients", "grads-ok")[0]
    assert good["consistent"] and good["tensors_checked"] == 4
    ray.get([h.train_step.remote(WORLD, skip_allreduce=(rank == 1)) for rank, h in enumerate(ranks)], timeout=120)
    report = run_all(ranks, "check_gradients", "grads-bad")[0]
    assert not report["consistent"]
    assert {m["name"] for m in report["mismatches"]} == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(m["outlier_ranks"] == [1] and m["kind"] == "value" for m in report["mismatches"])


def test_tolerance_accepts_small_and_reports_large_diffs(ranks):
    base = np.linspace(0, 1, 1000)
    tensors = [{"small": base + (1e-9 if rank == 2 else 0), "large": base + (1e-2 if rank == 0 else 0)}
               for rank in range(WORLD)]
    reports = ray.get([h.verify.remote(t, 1e-6, "sync") for h, t in zip(ranks, tensors)], timeout=120)
    report = reports[3]
    assert report["key"] == "sync" and report["within_tolerance"] == ["small"]
    [mismatch] = report["mismatches"]
    assert mismatch["name"] == "large" and mismatch["outlier_ranks"] == [0]
    assert mismatch["max_abs_diff"] == pytest.approx(1e-2, rel=1e-6) and mismatch["first_index"] == [0]


def test_data_file_that_differs_on_one_rank(ranks, tmp_path):
    good = tmp_path / "train.jsonl"
    good.write_text("".join(json.dumps({"id": i, "text": f"sample {i}"}) + "\n" for i in range(200)))
    bad = tmp_path / "train_rank2.jsonl"
    lines = good.read_text().splitlines(keepends=True)
    lines[100] = json.dumps({"id": 100, "text": "sample 100 (different preprocessing)"}) + "\n"
    bad.write_text("".join(lines))
    paths = [str(good), str(good), str(bad), str(tmp_path / "nowhere.jsonl")]
    reports = ray.get([h.check_data.remote(p, [0, 100, 150], "data") for h, p in zip(ranks, paths)], timeout=120)
    mismatches = {m["name"]: m for m in reports[0]["mismatches"]}
    assert mismatches["exists"]["outlier_ranks"] == [3]
    assert mismatches["sample[100]"]["groups"][-1] == [2]
    assert 2 in mismatches["size"]["outlier_ranks"]
    assert "sample[0]" not in mismatches or mismatches["sample[0]"]["kind"] == "missing"


def test_inspect_distributed_tensor_replicated_and_sharded(ranks):
    replicated = run_all(ranks, "inspect", "layer0_weight")
    assert replicated[0]["layout"] == "replicated" and replicated[0]["consistent"]
    assert replicated[0]["stats"]["nan_count"] == 0 and len(replicated[0]["shards"]) == WORLD
    sharded = run_all(ranks, "inspect", "layer0_weight_rows", shard_dim=0)[2]
    assert sharded["layout"] == "sharded" and sharded["consistent"] and sharded["shape"] == [64, 32]
    assert [s["offset"] for s in sharded["shards"]] == [0, 16, 32, 48]
    assert all(s["percent"] == 25.0 for s in sharded["shards"])


def test_compare_from_driver_and_seeds(ranks):
    seeds = rs.set_random_seed(7, workers=ranks)
    assert seeds.worker_seeds == {0: 7, 1: 8, 2: 9, 3: 10} and not seeds.errors
    report = rs.compare(ranks, lambda self: self.model[2].weight.detach().clone())
    assert report.consistent and report.world_size == WORLD
    draws = rs.compare(ranks, lambda self: self.random_draws())
    assert not draws.consistent, "seed + rank gives every worker its own stream"

    def perturbed(self):
        weight = self.model[2].weight.detach().clone()
        if self.rank == 3:
            weight[1, 2] += 0.5
        return {"w": weight, "step": 10}

    report = rs.compare(ranks, perturbed, atol=0.1)
    [mismatch] = report.mismatches
    assert mismatch.name == "w" and mismatch.outlier_ranks == [3] and mismatch.first_index == [1, 2]
    assert mismatch.max_abs_diff == pytest.approx(0.5, rel=1e-5)


def test_cli_lists_checks_and_exits_1_on_mismatch(ranks, ray_cluster, capsys):
    from raysleuth.cli import main

    ray.get(ranks[0].perturb.remote("0.weight", (0, 0), 1.0), timeout=60)
    try:
        run_all(ranks, "check", "cli-bad")
    finally:
        run_all(ranks, "restore")
    run_all(ranks, "flush_evidence")
    capsys.readouterr()
    code = main(["consistency", "--home", str(ray_cluster.home), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["checks"][0]["key"] == "cli-bad" and not data["checks"][0]["consistent"]
    assert data["checks"][0]["mismatches"][0]["name"] == "0.weight"
    code = main(["consistency", "--home", str(ray_cluster.home)])
    out = capsys.readouterr().out
    assert code == 1 and "0.weight" in out and "cli-bad" in out
    mine = ray.get_runtime_context().get_job_id()
    code = main(["consistency", "--home", str(ray_cluster.home), "--json", "--job", mine])
    assert code == 1 and json.loads(capsys.readouterr().out)["checks"][0]["key"] == "cli-bad"
    code = main(["consistency", "--home", str(ray_cluster.home), "--json", "--job", "7f000000"])
    assert code == 0 and json.loads(capsys.readouterr().out)["checks"] == []


def test_an_incomplete_meeting_keeps_its_topics_until_every_rank_that_came_has_closed(ranks):
    """Full-suite CI under load: the lowest rank of an incomplete check dropped the topics at once, and a peer
    still reading the data after its own deadline found it empty (every rank, itself too, listed as missing)."""
    from concurrent.futures import ThreadPoolExecutor

    from raysleuth.consistency.exchange import MailboxExchange
    from raysleuth.recorder.writer import get_writer

    writer, base = get_writer(), f"consistency/test-close/{time.time_ns()}"
    exchanges = [MailboxExchange(rank, 4, 1.0, base, writer) for rank in range(3)]  # rank 3 never comes
    with ThreadPoolExecutor(3) as pool:
        posted = list(pool.map(lambda ex: ex.round("fp", {"rank": ex.rank}, expected=[0, 1, 2, 3]), exchanges))
    assert [sorted(p) for p in posted] == [[0, 1, 2]] * 3
    exchanges[0].close([0, 1, 2], complete=False)  # the lowest rank is done first
    assert sorted(ray.get(writer.read.remote(f"{base}/fp"), timeout=30)) == ["0", "1", "2"]  # peers still read it
    exchanges[1].close([0, 1, 2], complete=False)
    exchanges[2].close([0, 1, 2], complete=False)
    deadline = time.monotonic() + 30
    while ray.get(writer.read.remote(f"{base}/fp"), timeout=30) and time.monotonic() < deadline:
        time.sleep(0.1)  # drop is fire-and-forget
    assert ray.get(writer.read.remote(f"{base}/fp"), timeout=30) == {}  # the last one cleans up


def test_a_fingerprint_round_reads_only_what_the_ranks_do_not_all_agree_on(ranks):
    """O(tensors) a rank, not every rank's digests of every tensor: the writer leaves out what all ranks signed
    alike, and a rank whose post is an error still comes whole."""
    from concurrent.futures import ThreadPoolExecutor

    from raysleuth.consistency.exchange import MailboxExchange
    from raysleuth.recorder.writer import get_writer

    writer, base = get_writer(), f"consistency/test-agreed/{time.time_ns()}"
    exchanges = [MailboxExchange(rank, 4, 30.0, base, writer) for rank in range(4)]

    def meet(exchange):
        if exchange.rank == 3:
            return exchange.round("fp", {"error": "rank 3 could not fingerprint"}, expected=[3]), set()
        values = {"same": f"digests of same on {exchange.rank}", "odd": f"digests of odd on {exchange.rank}"}
        signatures = {"same": "s1", "odd": "o2" if exchange.rank == 2 else "o1"}
        return exchange.round_agreed("fp", values, signatures, expected=[0, 1, 2, 3])

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(meet, exchanges))
    for posted, agreed in answers[:3]:
        assert agreed == {"same"}
        assert posted == {0: {"odd": "digests of odd on 0"}, 1: {"odd": "digests of odd on 1"},
                          2: {"odd": "digests of odd on 2"}, 3: {"error": "rank 3 could not fingerprint"}}
    for exchange in exchanges:
        exchange.close([0, 1, 2, 3], complete=True)
