"""`raysleuth stacks` on real jobs that contain no raysleuth: gloo DDP actors, a parameter server, Ray Train, verl.

Each victim (tests/victims/real_jobs.py) is its own driver process, as users
run jobs; ranks come from where those jobs put them (runtime_env RANK, Ray
Train's records, verl's environment). Each test asserts the culprit's rank,
the rule that named it and the exit code; healthy jobs must name no one.
Each test starts its own victim (started all at once, they starve each
other on a small machine) and scopes `stacks` to that victim's pids.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from raysleuth.cli import main
from victim_process import Victim

HERE = Path(__file__).parent


SPECS = {
    "gloo_stuck": ("gloo", "--workers", "3", "--stuck-rank", "1"),
    "gloo_raise": ("gloo", "--workers", "3", "--raise-rank", "2"),
    "gloo_swap": ("gloo", "--workers", "3", "--swap-rank", "2"),
    "gloo_healthy": ("gloo", "--workers", "3", "--seconds", "900"),
    "ps_dead": ("ps", "--workers", "3", "--die-rank", "1"),
    "train_stuck": ("train", "--workers", "2", "--stuck-rank", "1"),
    "train_healthy": ("train", "--workers", "2", "--seconds", "900"),
    "verl_stuck": ("verl", "--workers", "2", "--stuck-rank", "1"),
    "verl_healthy": ("verl", "--workers", "2", "--seconds", "900"),
}


class Victims(dict):
    """Victims by name, each started on first use and stopped when the module ends."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def __missing__(self, name: str) -> Victim:
        victim = self[name] = Victim(self.address, *SPECS[name])
        return victim


@pytest.fixture(scope="module")
def victims(ray_cluster):
    started = Victims(ray_cluster.address)
    yield started
    for victim in started.values():
        victim.stop()


def stacks(address: str, victim: Victim, *extra: str, capsys) -> tuple[int, dict]:
    args = ["stacks", "--address", address, "--json", "--no-record", "--timeout", "60", *extra]
    for pid in victim.pids():
        args += ["--pid", str(pid)]
    capsys.readouterr()
    code = main(args)
    captured = capsys.readouterr()
    try:
        return code, json.loads(captured.out)
    except ValueError:
        raise AssertionError(f"stacks exited {code} without JSON: {captured.out[-300:]!r} {captured.err[-300:]!r}")


def poll(address, victim, condition, capsys, timeout=120.0, *extra):
    deadline = time.monotonic() + timeout
    code, data = None, {}
    while time.monotonic() < deadline:
        code, data = stacks(address, victim, *extra, capsys=capsys)
        if condition(code, data):
            return code, data
        time.sleep(1)
    return code, data


def culprits(data: dict) -> list[tuple]:
    return [(c["rank"], c["rule"], c["rank_source"]) for c in data["verdict"]["culprits"]]


def ranks_of(data: dict, actor_class: str) -> list[tuple]:
    return sorted((p["rank"], p["rank_source"]) for p in data["processes"] if p["actor_class"] == actor_class)


def driver_of(data: dict, victim: Victim) -> dict:
    return next(p for p in data["processes"] if p["pid"] == victim.proc.pid)


def _peers_wait(data: dict, stuck: int, actor_class: str = "DDPRank", settled=("waiting", "blocked")) -> bool:
    """Every other rank of the class has settled (until then the stuck rank is named by the driver's wait-for chain:
    the same rank, by weaker evidence)."""
    peers = [p for p in data["processes"] if (p["actor_class"] or "").endswith(actor_class) and p["rank"] != stuck]
    return bool(peers) and all(p["activity"] in settled for p in peers)


def test_gloo_rank_stuck_before_the_collective(ray_cluster, victims, capsys):
    victim = victims["gloo_stuck"].ready()
    try:
        victim.wait_for("DDPRank", 3)
        code, data = poll(ray_cluster.address, victim,
                          lambda code, data: data["verdict"]["culprits"] and _peers_wait(data, 1), capsys)
        assert code == 1, data["verdict"]
        assert culprits(data) == [(1, "peers", "environment")]
        culprit = data["verdict"]["culprits"][0]
        assert culprit["function"].endswith("next_batch") and "2 of 3 DDPRank peers" in culprit["reason"]
        assert "backward (torch.autograd" in culprit["reason"] or "all_reduce (torch.distributed)" in culprit["reason"]
        assert ranks_of(data, "DDPRank") == [(0, "environment"), (1, "environment"), (2, "environment")]
        assert driver_of(data, victim)["rank"] is None
    finally:
        victim.stop()


def test_gloo_rank_whose_call_raised_left_its_peers_waiting(ray_cluster, victims, capsys):
    victim = victims["gloo_raise"].ready()
    try:
        victim.wait_for("DDPRank", 3)
        code, data = poll(ray_cluster.address, victim, lambda code, data: data["verdict"]["culprits"], capsys)
        assert code == 1, data["verdict"]
        assert culprits(data) == [(2, "peers", "environment")]
        assert "left the collective" in data["verdict"]["culprits"][0]["reason"]
        assert "all_reduce (torch.distributed)" in data["verdict"]["culprits"][0]["reason"]
    finally:
        victim.stop()


def test_gloo_deadlock_where_every_rank_waits_is_hung(ray_cluster, victims, capsys):
    victim = victims["gloo_swap"].ready()
    try:
        victim.wait_for("DDPRank", 3)
        code, data = poll(ray_cluster.address, victim, lambda code, data: data["verdict"]["state"] == "hung", capsys)
        verdict = data["verdict"]
        assert code == 1 and verdict["state"] == "hung" and verdict["culprits"] == [], verdict
        assert verdict["summary"].startswith("hung: every rank waits in all_reduce (torch.distributed); "
                                             "no rank stands apart")
        assert verdict["next_command"]
        # one sample cannot measure progress: not an all-clear (exit 2, unsure), and a note says how to tell
        code, data = stacks(ray_cluster.address, victim, "--once", capsys=capsys)
        assert (code, data["verdict"]["state"]) == (2, "unsure")
        assert any("--once" in note for note in data["verdict"]["notes"])
    finally:
        victim.stop()


def test_healthy_gloo_job_with_its_driver_blocked_in_ray_get(ray_cluster, victims, capsys):
    victim = victims["gloo_healthy"].ready()
    try:
        victim.wait_for("DDPRank", 3)
        time.sleep(3)  # past start-up: the ranks train
        for _ in range(3):
            code, data = stacks(ray_cluster.address, victim, capsys=capsys)
            assert code == 0 and data["verdict"]["culprits"] == [], data["verdict"]
            assert data["verdict"]["state"] == "busy"
        assert ranks_of(data, "DDPRank") == [(0, "environment"), (1, "environment"), (2, "environment")]
        # the driver waits in ray.get on each rank's train call: chains that end in working ranks
        assert any(chain[0]["pid"] == victim.proc.pid for chain in data["verdict"]["chains"])
    finally:
        victim.stop()


def test_parameter_server_rank_that_died(ray_cluster, victims, capsys):
    victim = victims["ps_dead"].ready()
    try:
        code, data = poll(ray_cluster.address, victim, lambda code, data: data["verdict"]["culprits"], capsys)
        assert code == 1, data["verdict"]
        assert [(r, rule) for r, rule, _ in culprits(data)] == [(1, "dead peer")]
        reason = data["verdict"]["culprits"][0]["reason"]
        assert "died" in reason and "ray.get" in reason
        assert ranks_of(data, "PSWorker") == [(0, "environment"), (2, "environment")]
    finally:
        victim.stop()


def test_ray_train_rank_stuck_and_healthy(ray_cluster, victims, capsys):
    victim = victims["train_stuck"].ready()
    try:
        victim.wait_for("RayTrainWorker", 2)
        code, data = poll(ray_cluster.address, victim, lambda code, data: data["verdict"]["culprits"]
                          and _peers_wait(data, 1, "RayTrainWorker"), capsys)
        assert code == 1, data["verdict"]
        assert culprits(data) == [(1, "peers", "ray train")]
        assert data["verdict"]["culprits"][0]["function"] == "fetch_batch"
        assert ranks_of(data, "RayTrainWorker") == [(0, "ray train"), (1, "ray train")]
        worker = next(p for p in data["processes"] if p["rank"] == 1)
        assert any(t["name"].startswith("TrainingThread(") for t in worker["threads"])
    finally:
        victim.stop()
    healthy = victims["train_healthy"].ready()
    try:
        healthy.wait_for("RayTrainWorker", 2)
        poll(ray_cluster.address, healthy, lambda code, data: len(ranks_of(data, "RayTrainWorker")) == 2
             and all(r is not None for r, _ in ranks_of(data, "RayTrainWorker")), capsys)
        time.sleep(3)
        for _ in range(2):
            code, data = stacks(ray_cluster.address, healthy, capsys=capsys)
            assert code == 0 and data["verdict"]["culprits"] == [], data["verdict"]
    finally:
        healthy.stop()


def test_verl_group_of_two_rank_never_returns(ray_cluster, victims, capsys):
    pytest.importorskip("verl.single_controller.ray")
    victim = victims["verl_stuck"].ready()
    try:
        code, data = poll(ray_cluster.address, victim, lambda code, data: data["verdict"]["culprits"]
                          and _peers_wait(data, 1, "ToyWorker", ("returned",)), capsys)
        assert code == 1, data["verdict"]
        assert culprits(data) == [(1, "peers", "verl environment")]
        assert "have returned" in data["verdict"]["culprits"][0]["reason"]
        assert driver_of(data, victim)["rank"] is None  # the driver is not "rank 0"
    finally:
        victim.stop()
    healthy = victims["verl_healthy"].ready()
    try:
        time.sleep(3)
        for _ in range(2):
            code, data = stacks(ray_cluster.address, healthy, capsys=capsys)
            assert code == 0 and data["verdict"]["culprits"] == [], data["verdict"]
        assert sorted(r for p in data["processes"] if p["role"] == "actor" for r in [p["rank"]]) == [0, 1]
    finally:
        healthy.stop()
