"""raysleuth stacks on the real 2-node cluster: grouping, verdict, wait-for chain, partial results, CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from polling import poll

from raysleuth.stacks import dump_stacks
from victims import hangs


@pytest.fixture(scope="module")
def collective_hang(ray_cluster):
    barrier, trainers, refs, pids = hangs.start_collective_hang(
        world=4, stuck_rank=2, node_ids=[ray_cluster.head_node_id, ray_cluster.worker_node_id])
    yield pids
    hangs.kill(barrier, *trainers)


def _own(pids):
    """The victims' pids: the session cluster is shared, other modules' actors may still be around."""
    return list(pids.values()) if isinstance(pids, dict) else list(pids)


def _trainers(report):
    return [p for p in report.processes if p.actor_class == "Trainer"]


def test_collective_hang_names_the_straggler(ray_cluster, collective_hang):
    pids = collective_hang

    def settled(report):
        waiting = [g for g in report.groups if "all_reduce" in g.headline and g.count == 3]
        return bool(waiting) and report.verdict.culprits

    report = poll(lambda: dump_stacks(ray_cluster.address, pids=_own(pids), timeout=60), settled, timeout=90.0, interval=1.0)
    assert settled(report), report.to_dict()
    # every rank labelled, on both nodes
    trainers = _trainers(report)
    assert sorted(p.rank for p in trainers) == [0, 1, 2, 3]
    assert {p.node_ip for p in trainers} and {p.node_id for p in trainers} == {ray_cluster.head_node_id,
                                                                               ray_cluster.worker_node_id}
    assert all(p.role == "actor" and p.task_name == "Trainer.train_step" for p in trainers)
    # grouping: the three waiting ranks share one group; rank 2 is alone
    waiting = next(g for g in report.groups if "all_reduce" in g.headline and g.count == 3)
    assert waiting.ranks == [0, 1, 3]
    assert sorted(waiting.pids) == sorted(pids[r] for r in (0, 1, 3))
    alone = next(g for g in report.groups if 2 in g.ranks)
    assert alone.count == 1 and "load_batch" in alone.headline
    # verdict: rank 2, its pid, its function
    culprit = report.verdict.culprits[0]
    assert (culprit.rank, culprit.pid) == (2, pids[2]) and culprit.function.endswith("load_batch")
    assert "all_reduce" in culprit.reason
    # raysleuth's own actors are never shown
    assert not any((p.actor_class or "") in ("NodeAgent", "EvidenceWriter") for p in report.processes)
    # the test process itself (a driver) is left out
    assert os.getpid() not in [p.pid for p in report.processes if p.role == "driver"]


def test_rank_filter_and_unknown_rank(ray_cluster, collective_hang):
    from raysleuth.errors import WorkerNotFound

    report = dump_stacks(ray_cluster.address, rank=2, pids=_own(collective_hang), timeout=60)
    assert [p.rank for p in report.processes] == [2]
    with pytest.raises(WorkerNotFound, match="rank 99"):
        dump_stacks(ray_cluster.address, rank=99, timeout=60)


def test_partial_report_when_py_spy_times_out(ray_cluster, collective_hang):
    pids = collective_hang
    started = time.monotonic()
    report = dump_stacks(ray_cluster.address, pids=[pids[0], 999_999], timeout=30, per_process_timeout=0.001)
    assert time.monotonic() - started < 45
    assert report.partial
    reasons = {(m.pid, m.reason) for m in report.missing}
    assert any(pid == 999_999 and "no Ray worker" in reason for pid, reason in reasons)
    assert any(pid == pids[0] and "timed out" in reason for pid, reason in reasons)
    assert report.process(pids[0]).error and not report.process(pids[0]).threads


def test_cli_json_and_text(ray_cluster, collective_hang, capsys, tmp_path):
    from raysleuth.cli import main

    pids = collective_hang
    code = main(["stacks", "--address", ray_cluster.address, "--json", "--timeout", "60"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert {"processes", "groups", "verdict", "missing"} <= set(data)
    proc = next(p for p in data["processes"] if p["pid"] == pids[2])
    assert proc["rank"] == 2 and proc["actor_class"] == "Trainer" and proc["role"] == "actor"
    assert proc["threads"][0]["frames"][0]["function"].endswith("load_batch")
    assert {"function", "file", "line"} <= set(proc["threads"][0]["frames"][0])
    assert data["verdict"]["culprits"] and data["verdict"]["culprits"][0]["pid"] == pids[2], data["verdict"]
    out_file = tmp_path / "stacks.txt"
    code = main(["stacks", "--address", ray_cluster.address, "--output", str(out_file), "--timeout", "60"])
    text = capsys.readouterr().out
    assert code == 1
    assert "3 ranks [0, 1, 3] Trainer" in text and "verdict:" in text and "load_batch" in text
    written = out_file.read_text()
    assert re.search(r"rank 2 \(from (registered|actor name)\), pid %d" % pids[2], written), written


def test_wait_for_chain_from_a_separate_driver(ray_cluster):
    env = dict(os.environ)
    driver = subprocess.Popen([sys.executable, "-m", "victims.hangs", "chain", "--address", ray_cluster.address],
                              cwd=str(Path(__file__).parent), env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    try:
        line = driver.stdout.readline()
        assert line.startswith("worker-pid"), line
        worker_pid = int(line.split()[1])

        def chained(report):
            return any(c.pid == worker_pid for c in report.verdict.culprits)

        report = poll(lambda: dump_stacks(ray_cluster.address, timeout=60), chained, timeout=90.0, interval=1.0)
        assert chained(report), report.verdict
        chain = next(c for c in report.verdict.chains if c[-1].pid == worker_pid)
        assert chain[0].role == "driver" and chain[0].pid == driver.pid and chain[0].waiting
        assert [link.task_name for link in chain[1:]] == ["Coordinator.forward", "Worker.compute"]
        assert chain[1].waiting and not chain[2].waiting
        culprit = next(c for c in report.verdict.culprits if c.pid == worker_pid)
        assert culprit.function == "slow_compute" and "wait-for chain" in culprit.reason
        assert culprit.actor_class == "Worker"
    finally:
        driver.kill()
        driver.wait(timeout=30)


def test_subprocess_of_an_actor_is_attributed_to_it(ray_cluster):
    spawner = hangs.Spawner.options(name="spawner_rank5").remote()
    try:
        actor_pid, child_pid = ray.get(spawner.spawn.remote(), timeout=120)
        report = poll(lambda: dump_stacks(ray_cluster.address, timeout=60),
                      lambda r: r.process(child_pid) is not None and r.process(child_pid).threads, timeout=60)
        child = report.process(child_pid)
        assert child is not None and child.threads, report.missing
        assert (child.role, child.parent_pid, child.actor_class, child.rank) == ("child", actor_pid, "Spawner", 5)
        assert child.threads[0].frames[0].file == "<string>"
    finally:
        hangs.kill(spawner)
