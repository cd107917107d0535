"""`raysleuth doctor` on this machine and on the real 2-node cluster."""

import json

from raysleuth.cli import main
from raysleuth.doctor import run_doctor
from raysleuth.doctor.checks import _at_least
from raysleuth.doctor.local_checks import _debug_checks


def test_versions_compare_as_versions_not_strings():
    assert _at_least("1.10.0", "1.8")  # as strings "1.10.0" < "1.8"
    assert _at_least("2.60.0", "2.10")
    assert not _at_least("2.9.3", "2.10")
    assert not _at_least("garbage", "1.0")


def test_debug_checks_say_which_alias_won():
    checks = {c.name: c for c in _debug_checks({"VERL_DEBUG": "1", "PYTHONBREAKPOINT": "ipdb.set_trace"})}
    assert checks["debug mode"].status == "ok"
    assert "Ray debug mode enabled" in checks["debug mode"].detail
    assert "RAYSLEUTH_DEBUG from VERL_DEBUG" in checks["debug mode"].detail
    assert checks["PYTHONBREAKPOINT"].status == "warn"
    conflict = {c.name: c for c in _debug_checks({"RAYSLEUTH_DEBUG": "0", "VERL_DEBUG": "1"})}
    assert conflict["RAYSLEUTH_DEBUG aliases"].status == "warn"
    assert "RAYSLEUTH_DEBUG wins" in conflict["RAYSLEUTH_DEBUG aliases"].detail
    exposed = {c.name: c for c in _debug_checks({"RAYSLEUTH_DEBUG_HOST": "0.0.0.0"})}
    assert exposed["debug server host"].status == "warn"


def test_local_checks_without_a_cluster(capsys):
    code = main(["doctor", "--no-ray", "--json"])
    report = json.loads(capsys.readouterr().out)
    names = {c["name"]: c for c in report["checks"]}
    assert {"python", "ray", "debugpy", "py-spy", "psutil", "torch"} <= set(names)
    assert names["py-spy"]["status"] == "ok", names["py-spy"]  # real py-spy dumped a real process
    assert code == (0 if report["ok"] else 1)


def test_full_doctor_on_two_nodes(ray_cluster, capsys):
    code = main(["doctor", "--address", ray_cluster.address, "--full", "--json", "--timeout", "90"])
    report = json.loads(capsys.readouterr().out)
    checks = report["checks"]
    by_name = {}
    for check in checks:
        by_name.setdefault(check["name"], []).append(check)
    assert by_name["cluster reachable"][0]["status"] == "ok"
    assert "2 alive" in by_name["nodes alive"][0]["detail"]
    # one per-node check for each node, both nodes present
    for name in ("versions", "py-spy on node", "spill disk"):
        nodes = {check["node"] for check in by_name[name]}
        assert any(ray_cluster.head_node_id[:8] in node for node in nodes), (name, nodes)
        assert any(ray_cluster.worker_node_id[:8] in node for node in nodes), (name, nodes)
    for name in ("python version match", "ray version match"):
        assert by_name[name][0]["status"] == "ok"
    assert all(check["status"] == "ok" for check in by_name["py-spy on node"])
    assert by_name["token authentication"][0]["status"] in ("ok", "warn")
    assert {"GCS port", "dashboard port"} <= set(by_name)
    failed = [check for check in checks if check["status"] == "fail"]
    assert code == (1 if failed else 0)


def test_doctor_report_is_stored_as_evidence(ray_cluster):
    from raysleuth.recorder import open_store

    report = run_doctor(ray_cluster.address, timeout=90)
    store = open_store(home=ray_cluster.home)
    stored = store.query("doctor", newest_first=True, limit=1)
    assert stored and stored[0].data["counts"] == report.counts()
