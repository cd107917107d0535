"""Collective forensics on real gloo jobs: which rank broke the sequence, and how.

Six jobs run at once on the session cluster, each a real driver
(victims/collective_faults.py, no raysleuth inside) given raysleuth only as
Ray's worker setup hook, the way ``ray job submit --runtime-env-json`` hands
it over. Rank 1 breaks the sequence at step 4; the healthy job keeps
training while it is examined (until the module ends: it never finishes).
"""

from __future__ import annotations

import json
import time

import pytest

from victims.record_collective_dumps import job_started, start_job

# fault -> (raysleuth mode in the workers, expected culprit kind)
JOBS = {
    "skip": ("full", "skipped"),
    "shape": ("full", "shape"),
    "op": ("full", "op"),
    "stuck": ("light", "stuck"),  # light mode: no periodic dumps, the dump on request must do
    "die": ("full", "dead"),
    "healthy": ("light", None),
}


@pytest.fixture(scope="module")
def jobs(ray_cluster):
    drivers = {}
    for fault, (mode, _) in JOBS.items():
        steps, pause = {"healthy": (100_000, 0.1), "die": (8, 1.0)}.get(fault, (8, 0.3))
        # A mismatch needs a third rank to outvote the one gloo may abort; the rest run 2 ranks (a smaller load).
        world_size = 3 if fault in ("skip", "shape", "op") else 2
        drivers[fault] = start_job(fault, ray_cluster.address, mode=mode, steps=steps, pause=pause, linger=300,
                                   world_size=world_size)
    try:
        started = {fault: job_started(driver) for fault, driver in drivers.items()}
        time.sleep(12)  # step 4 comes after 1.5-4 s; the peers then wait past --pending-after (5 s)
        yield {fault: {"job": job, "pids": pids, "driver": drivers[fault]} for fault, (job, pids) in started.items()}
    finally:
        for driver in drivers.values():
            driver.kill()
            driver.wait()


@pytest.fixture(scope="module")
def reports(ray_cluster, jobs):
    from raysleuth.collectives import collect_collectives

    return {fault: collect_collectives(ray_cluster.address, job=info["job"], wait=8)
            for fault, info in jobs.items()}


@pytest.mark.parametrize("fault", ["skip", "shape", "op", "stuck", "die"])
def test_culprit_rank_and_fault_kind(reports, fault):
    report = reports[fault]
    assert [(c.rank, c.kind) for c in report.culprits] == [(1, JOBS[fault][1])], report.verdict.summary
    culprit = report.culprits[0]
    assert culprit.rule == "collective positions"
    assert culprit.file.endswith("collective_faults.py")


def test_healthy_training_job_has_no_culprit(reports, jobs):
    report = reports["healthy"]
    assert report.culprits == [], report.verdict.summary
    assert sorted(r["rank"] for r in report.ranks) == [0, 1]
    assert report.answered == [0, 1]  # the live workers answered the dump request
    assert jobs["healthy"]["driver"].poll() is None  # still training


def test_dead_rank_is_known_dead_and_others_alive(reports):
    alive = {r["rank"]: r["alive"] for r in reports["die"].ranks}
    assert alive == {0: True, 1: False}


def test_stuck_rank_answers_from_its_control_thread_in_light_mode(reports):
    report = reports["stuck"]
    assert report.answered == [0, 1]
    assert "never entered" in report.culprits[0].reason


def test_collective_progress_is_a_heartbeat(ray_cluster, jobs, reports):
    from raysleuth import cluster
    from raysleuth.recorder import open_store

    pids = set(jobs["healthy"]["pids"])
    store = open_store(cluster.session_name(), home=ray_cluster.home)
    try:
        beats = [r for r in store.query("heartbeat") if r.pid in pids and r.data.get("source") == "collectives"]
    finally:
        store.close()
    assert beats and max(b.data["step"] for b in beats) > 2


def test_the_reports_read_of_the_stored_dumps_names_the_same_culprit(ray_cluster, jobs, reports):
    """The report reads a run's dumps as ``collectives --run`` does (one at a time); on real gloo jobs its verdict
    names the same rank and kind, and its section is the one the whole records made."""
    from raysleuth import cluster
    from raysleuth.collectives.report import read_collectives, stored_verdict
    from raysleuth.recorder import open_store
    from raysleuth.report import sections

    store = open_store(cluster.session_name(), home=ray_cluster.home)
    try:
        for fault in ("skip", "shape"):
            verdict = stored_verdict(store, jobs[fault]["job"])
            assert [(c.rank, c.kind) for c in verdict.culprits] == [(1, JOBS[fault][1])], verdict.summary
            assert sections.verdict_section(verdict) == sections.collective_section(
                read_collectives(store, jobs[fault]["job"]))
    finally:
        store.close()


def test_cli_names_the_culprit_and_exits_1(ray_cluster, jobs, reports, capsys):
    from raysleuth.cli import main

    code = main(["collectives", "--json", "--address", ray_cluster.address, "--job", jobs["op"]["job"], "--wait", "2"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(c["rank"], c["kind"]) for c in data["culprits"]] == [(1, "op")]
    assert data["groups"][0]["label"] == "default_pg"
    code = main(["collectives", "--address", ray_cluster.address, "--job", jobs["healthy"]["job"], "--wait", "8"])
    out = capsys.readouterr().out
    assert code == 0 and "rank 1" in out and "all_reduce(float32[64,64])" in out, out
    assert "light mode (the default) records no file:line" in " ".join(out.split()), out  # says what it has


def test_stored_run_gives_the_same_verdict_after_the_job_is_gone(ray_cluster, jobs, reports):
    from raysleuth import cluster
    from raysleuth.collectives import collect_collectives

    jobs["skip"]["driver"].kill()
    jobs["skip"]["driver"].wait()
    report = collect_collectives(run=cluster.session_name(), home=ray_cluster.home, job=jobs["skip"]["job"])
    assert not report.live
    assert [(c.rank, c.kind) for c in report.culprits] == [(1, "skipped")]
