"""Breakpoints on a real 2-node Ray: debugpy with a real DAP client, pdb over a real socket.

Every actor here is armed through its runtime_env (RAYSLEUTH_DEBUG=1) or at
runtime from the CLI, with a bounded RAYSLEUTH_DEBUG_WAIT so a failing test
can never hang the suite.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raysleuth import breakpoints
from raysleuth.breakpoints import DebugSession, attach_instructions, merge_launch_json

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------ pure helpers


def _session(**overrides) -> DebugSession:
    data = dict(id="abc1", kind="debugpy", state="waiting", host="127.0.0.1", port=5678, name="bp", rank=3,
                pid=42, node_ip="10.0.0.12", file="/x/train.py", line=7, since=1.0, updated=1.0)
    data.update(overrides)
    return DebugSession(**data)


def test_attach_instructions_remote_node_gets_ssh_tunnel():
    how = attach_instructions(_session(), local_ips={"127.0.0.1", "10.0.0.1"})
    assert how["remote"] is True
    assert how["ssh_tunnel"] == "ssh -N -L 5678:127.0.0.1:5678 10.0.0.12"
    assert how["vscode"]["connect"] == {"host": "127.0.0.1", "port": 5678}
    assert how["vscode"]["request"] == "attach" and how["vscode"]["type"] == "debugpy"
    local = attach_instructions(_session(node_ip="10.0.0.1"), local_ips={"127.0.0.1", "10.0.0.1"})
    assert local["remote"] is False and local["ssh_tunnel"] is None
    pdb_kind = attach_instructions(_session(kind="pdb", node_ip="10.0.0.1"), local_ips={"10.0.0.1"})
    assert pdb_kind["command"] == "raysleuth debug attach abc1"


def test_merge_launch_json_keeps_user_configurations_and_replaces_ours():
    existing = """{
        // my own config, with a comment and a trailing comma
        "version": "0.2.0",
        "configurations": [
            {"name": "my script", "type": "debugpy", "request": "launch", "program": "a.py",},
            {"name": "raysleuth: rank 9 old", "type": "debugpy", "request": "attach"},
        ],
    }"""
    new = [breakpoints.vscode_configuration(_session())]
    merged = merge_launch_json(existing, new)
    names = [config["name"] for config in merged["configurations"]]
    assert names[0] == "my script"
    assert not any("rank 9 old" in name for name in names)
    assert names[1].startswith("raysleuth: rank 3") and len(names) == 2
    with pytest.raises(ValueError):
        merge_launch_json("{not json", new)


def test_latest_state_wins():
    rows = [dict(_session().to_dict(), state="waiting", updated=1.0),
            dict(_session().to_dict(), state="released", updated=3.0, reason="client detached"),
            dict(_session().to_dict(), state="attached", updated=2.0)]
    (latest,) = breakpoints._sessions.latest_states(rows)
    assert latest.state == "released" and latest.reason == "client detached"


def test_disarmed_breakpoint_is_a_quick_no_op():
    from raysleuth import runtime

    runtime.reload_settings(debug=False)
    breakpoints.arming._initialised_pid = None
    started = time.perf_counter()
    breakpoints.breakpoint(name="never")  # first call starts the poll thread
    assert breakpoints.arming._quiet is True
    for _ in range(10_000):
        breakpoints.breakpoint(name="never", rank=0)
    assert time.perf_counter() - started < 1.0
    assert breakpoints.arm_state().armed is False


# ------------------------------------------------------------ Ray helpers


class Dap:
    """A minimal Debug Adapter Protocol client: Content-Length framed JSON over TCP."""

    def __init__(self, host: str, port: int, timeout: float = 60.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buffer = b""
        self.seq = 0
        self.seen: list[dict] = []

    def send(self, command: str, **arguments) -> int:
        self.seq += 1
        body = json.dumps({"seq": self.seq, "type": "request", "command": command, "arguments": arguments}).encode()
        self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return self.seq

    def receive(self) -> dict:
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, "debug adapter closed the connection"
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        while len(self.buffer) < length:
            self.buffer += self.sock.recv(65536)
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        message = json.loads(body)
        self.seen.append(message)
        return message

    def response(self, seq: int) -> dict:
        while True:
            message = self.receive()
            if message.get("type") == "response" and message.get("request_seq") == seq:
                return message

    def event(self, name: str) -> dict:
        while True:
            message = self.receive()
            if message.get("type") == "event" and message.get("event") == name:
                return message

    def close(self) -> None:
        self.sock.close()


def _actors(count: int, env: dict[str, str], ranks=None):
    import ray

    from victims.breakpoint_actors import BreakpointWorker

    cls = ray.remote(BreakpointWorker)
    env = {"RAYSLEUTH_HOME": os.environ["RAYSLEUTH_HOME"], **env}
    return [cls.options(num_cpus=0.1, runtime_env={"env_vars": env}).remote(rank)
            for rank in (ranks if ranks is not None else range(count))]


def _kill(actors) -> None:
    import ray

    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:
            pass


def _cli_json(capsys, *argv) -> dict:
    from raysleuth.cli import main

    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def _wait_session(capsys, address: str, predicate, timeout: float = 90.0, all_: bool = False) -> dict:
    deadline = time.monotonic() + timeout
    argv = ["debug", "ls", "--json", "--address", address] + (["--all"] if all_ else [])
    while time.monotonic() < deadline:
        found = [s for s in _cli_json(capsys, *argv)["sessions"] if predicate(s)]
        if found:
            return found[-1]
        time.sleep(0.3)
    raise AssertionError("no matching debug session appeared")


def _read_until(connection: socket.socket, marker: bytes, timeout: float = 60.0) -> bytes:
    connection.settimeout(timeout)
    data = b""
    while marker not in data:
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


# ------------------------------------------------------------ Ray tests


def test_breakpoint_on_rank_stops_only_that_rank_and_a_dap_client_attaches(ray_cluster, capsys, tmp_path):
    import ray

    actors = _actors(4, {"RAYSLEUTH_DEBUG": "1", "RAYSLEUTH_DEBUG_WAIT": "120"})
    try:
        refs = [actor.step_on_rank.remote(1) for actor in actors]
        others = [ref for index, ref in enumerate(refs) if index != 1]
        done = ray.get(others, timeout=120)
        assert [result["rank"] for result in done] == [0, 2, 3]
        session = _wait_session(capsys, ray_cluster.address, lambda s: s["rank"] == 1 and s["state"] == "waiting")
        assert session["host"] == "127.0.0.1" and session["port"] > 0 and session["kind"] == "debugpy"
        assert session["file"].endswith("breakpoint_actors.py") and session["function"] == "step_on_rank"
        ready, _ = ray.wait([refs[1]], timeout=1)
        assert not ready, "rank 1 should be stopped at its breakpoint"

        # debug vscode: one attach configuration for the waiting session, user's entries kept
        launch = tmp_path / ".vscode" / "launch.json"
        launch.parent.mkdir()
        launch.write_text('{"version": "0.2.0", "configurations": [{"name": "mine", "type": "debugpy", '
                          '"request": "launch"}]}')
        written = _cli_json(capsys, "debug", "vscode", "--json", "--path", str(launch), "--address",
                            ray_cluster.address)
        ours = [c for c in written["configurations"] if c["connect"]["port"] == session["port"]]
        assert len(ours) == 1
        on_disk = json.loads(launch.read_text())
        assert [c["name"] for c in on_disk["configurations"]][0] == "mine" and len(on_disk["configurations"]) >= 2

        client = Dap("127.0.0.1", session["port"])
        try:
            init = client.response(client.send("initialize", adapterID="debugpy", clientID="raysleuth-test",
                                               linesStartAt1=True, columnsStartAt1=True, pathFormat="path"))
            assert init["success"] is True and init["body"]["supportsConfigurationDoneRequest"]
            attach = client.send("attach", justMyCode=False)
            client.event("initialized")
            client.response(client.send("configurationDone"))
            stopped = client.event("stopped")
            trace = client.response(client.send("stackTrace", threadId=stopped["body"]["threadId"]))
            top = trace["body"]["stackFrames"][0]
            assert top["name"] == "step_on_rank"
            value = client.response(client.send("evaluate", expression="some_local", frameId=top["id"],
                                                context="repl"))
            assert value["body"]["result"] == "4243"
            assert any(m.get("request_seq") == attach and m.get("success") for m in client.seen)
            client.response(client.send("disconnect", terminateDebuggee=False))
        finally:
            client.close()
        assert ray.get(refs[1], timeout=60) == {"rank": 1, "after": 4244}
        released = _wait_session(capsys, ray_cluster.address,
                                 lambda s: s["id"] == session["id"] and s["state"] == "released", all_=True)
        assert released["reason"] == "client detached"
    finally:
        _kill(actors)


def test_pdb_session_driven_through_its_socket(ray_cluster, capsys):
    import ray

    (actor,) = _actors(1, {"RAYSLEUTH_DEBUG": "1", "RAYSLEUTH_DEBUGGER": "pdb", "RAYSLEUTH_DEBUG_WAIT": "120"},
                       ranks=[2])
    try:
        ref = actor.step_named.remote("after-rollout")
        session = _wait_session(capsys, ray_cluster.address,
                                lambda s: s["name"] == "after-rollout" and s["state"] == "waiting")
        assert session["kind"] == "pdb" and session["host"] == "127.0.0.1" and session["rank"] == 2
        secret_file = Path(session["secret_file"])
        assert secret_file.stat().st_mode & 0o777 == 0o600
        assert secret_file.read_text().strip() not in json.dumps(session)  # the secret is never published
        # A client without the secret, or with a wrong one, gets no prompt and is disconnected.
        with socket.create_connection(("127.0.0.1", session["port"]), timeout=60) as stranger:
            stranger.settimeout(1.5)
            with pytest.raises(socket.timeout):
                stranger.recv(100)  # nothing is said to a client that has not given the secret
        for offered in (b"not-the-secret\n", b"p some_local\n", b"\n"):
            with socket.create_connection(("127.0.0.1", session["port"]), timeout=60) as stranger:
                stranger.sendall(offered)
                stranger.settimeout(30)
                assert _read_until(stranger, b"(rs-pdb) ", timeout=30) == b""  # closed without a word
        with socket.create_connection(("127.0.0.1", session["port"]), timeout=60) as connection:
            connection.sendall(secret_file.read_text().encode())
            banner = _read_until(connection, b"(rs-pdb) ")
            assert b"step_named" in banner and b"after-rollout" in banner
            connection.sendall(b"p some_local\n")
            assert b"4244" in _read_until(connection, b"(rs-pdb) ")
            connection.sendall(b"c\n")
            assert b"worker continues" in _read_until(connection, b"session closed")
        assert ray.get(ref, timeout=60) == {"rank": 2, "after": 4245}
        released = _wait_session(capsys, ray_cluster.address,
                                 lambda s: s["id"] == session["id"] and s["state"] == "released", all_=True)
        assert released["reason"] == "continued"
        assert not secret_file.exists()  # spent
    finally:
        _kill([actor])


def test_disarm_releases_a_breakpoint_that_is_waiting(ray_cluster, capsys):
    """`debug disarm` (issue 29): a worker stopped at a breakpoint with no client runs on at once, not after 120 s."""
    import ray

    (actor,) = _actors(1, {"RAYSLEUTH_DEBUG": "1", "RAYSLEUTH_DEBUGGER": "pdb", "RAYSLEUTH_DEBUG_WAIT": "120"},
                       ranks=[7])
    try:
        ref = actor.step_named.remote("held")
        session = _wait_session(capsys, ray_cluster.address, lambda s: s["name"] == "held" and s["state"] == "waiting")
        ready, _ = ray.wait([ref], timeout=1)
        assert not ready
        started = time.monotonic()
        _cli_json(capsys, "debug", "disarm", "--json", "--address", ray_cluster.address)
        assert ray.get(ref, timeout=45)["after"] == 4250
        assert time.monotonic() - started < 45
        released = _wait_session(capsys, ray_cluster.address,
                                 lambda s: s["id"] == session["id"] and s["state"] == "released", all_=True)
        assert "disarm" in released["reason"]
    finally:
        try:
            breakpoints.reset_cluster()
        finally:
            _kill([actor])


def test_wait_limit_releases_an_unattended_breakpoint(ray_cluster, capsys):
    import ray

    from raysleuth.recorder import open_store

    (actor,) = _actors(1, {"RAYSLEUTH_DEBUG": "1", "RAYSLEUTH_DEBUG_WAIT": "2"}, ranks=[0])
    try:
        started = time.monotonic()
        assert ray.get(actor.step_conditional.remote(50.0), timeout=120) == {"rank": 0, "after": 50.0}
        assert time.monotonic() - started >= 2.0
        released = _wait_session(capsys, ray_cluster.address,
                                 lambda s: s["rank"] == 0 and s["function"] == "step_conditional"
                                 and s["state"] == "released", all_=True)
        assert released["reason"] == "no client attached within 2s"
        # the same location stays quiet until re-armed: a loop is not stalled 2 s per step
        started = time.monotonic()
        ray.get(actor.step_conditional.remote(60.0), timeout=60)
        assert time.monotonic() - started < 2.0
        # a condition that does not hold never stops
        started = time.monotonic()
        ray.get(actor.step_conditional.remote(1.0), timeout=60)
        assert time.monotonic() - started < 2.0
        # the evidence store keeps the history (waiting, then released) for `debug ls` without a cluster
        store = open_store(home=ray_cluster.home)
        try:
            states = [r.data["state"] for r in store.query("debug_session") if r.data["id"] == released["id"]]
        finally:
            store.close()
        assert states[0] == "waiting" and states[-1] == "released"
        from raysleuth import cluster

        offline = _cli_json(capsys, "debug", "ls", "--json", "--all", "--run", cluster.session_name(),
                            "--home", str(ray_cluster.home))
        assert offline["source"] == "store"
        assert any(s["id"] == released["id"] and s["state"] == "released" for s in offline["sessions"])
    finally:
        _kill([actor])


def test_post_mortem_session_at_the_crash_frame(ray_cluster, capsys):
    import ray

    (actor,) = _actors(1, {"RAYSLEUTH_DEBUGGER": "pdb", "RAYSLEUTH_DEBUG_WAIT": "120"}, ranks=[3])
    try:
        ref = actor.crash_then_post_mortem.remote()
        session = _wait_session(capsys, ray_cluster.address,
                                lambda s: s["name"] == "post-mortem" and s["rank"] == 3 and s["state"] == "waiting")
        assert session["exception"] == "ValueError: bad batch xxx"
        with socket.create_connection(("127.0.0.1", session["port"]), timeout=60) as connection:
            connection.sendall(Path(session["secret_file"]).read_text().encode())
            banner = _read_until(connection, b"(rs-pdb) ")
            assert b"ValueError: bad batch xxx" in banner
            connection.sendall(b"p crash_local\n")
            assert b"'xxx'" in _read_until(connection, b"(rs-pdb) ")
            connection.sendall(b"c\n")
            _read_until(connection, b"session closed")
        result = ray.get(ref, timeout=60)
        assert result["session"]["name"] == "post-mortem"
    finally:
        _kill([actor])


def test_arm_and_disarm_at_runtime_from_the_cli(ray_cluster, capsys):
    import ray

    (actor,) = _actors(1, {"RAYSLEUTH_DEBUGGER": "pdb", "RAYSLEUTH_DEBUG_WAIT": "120"}, ranks=[0])
    try:
        pid = ray.get(actor.pid.remote(), timeout=120)
        started = time.monotonic()
        assert ray.get(actor.step_named.remote("probe"), timeout=60)["after"] == 4243  # disarmed: runs through
        assert time.monotonic() - started < 5
        _cli_json(capsys, "debug", "arm", "probe", "--rank", "0", "--json", "--address", ray_cluster.address)
        from raysleuth.cli import main

        assert main(["debug", "arm", "probe", "--rank", "99", "--address", ray_cluster.address]) == 2
        refused = capsys.readouterr().err
        assert "no live worker has rank 99" in refused and "0" in refused.split("ranks alive:")[1]
        deadline = time.monotonic() + 30
        while not ray.get(actor.arm_state.remote(), timeout=30)["armed"]:
            assert time.monotonic() < deadline, "the worker never picked up `debug arm`"
            time.sleep(0.3)
        assert ray.get(actor.arm_state.remote(), timeout=30) == {"armed": True, "names": ["probe"], "ranks": [0],
                                                                 "source": "control"}
        ref = actor.step_named.remote("probe")
        session = _wait_session(capsys, ray_cluster.address, lambda s: s["name"] == "probe" and s["state"] == "waiting")
        assert session["pid"] == pid  # the same process: no restart
        # `debug attach ID`: the terminal bridge, fed from a pipe
        attach = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "raysleuth"), "debug", "attach", session["id"], "--address",
             ray_cluster.address],
            input="p some_local\nc\n", capture_output=True, text=True, timeout=120,
        )
        assert attach.returncode == 0, attach.stderr
        assert "4242" in attach.stdout and "worker continues" in attach.stdout
        assert ray.get(ref, timeout=60)["after"] == 4243
        _cli_json(capsys, "debug", "disarm", "--json", "--address", ray_cluster.address)
        deadline = time.monotonic() + 30
        while ray.get(actor.arm_state.remote(), timeout=30)["armed"]:
            assert time.monotonic() < deadline, "the worker never picked up `debug disarm`"
            time.sleep(0.3)
        started = time.monotonic()
        ray.get(actor.step_named.remote("probe"), timeout=60)
        assert time.monotonic() - started < 5
    finally:
        try:
            breakpoints.reset_cluster()
        finally:
            _kill([actor])


def test_doctor_check_debug_flags_a_server_on_every_interface(ray_cluster, capsys):
    import ray

    from raysleuth.doctor import run_doctor

    (actor,) = _actors(1, {"RAYSLEUTH_DEBUG": "1", "RAYSLEUTH_DEBUGGER": "pdb", "RAYSLEUTH_DEBUG_WAIT": "120",
                           "RAYSLEUTH_DEBUG_HOST": "0.0.0.0"}, ranks=[1])
    try:
        ref = actor.step_named.remote("exposed")
        session = _wait_session(capsys, ray_cluster.address, lambda s: s["name"] == "exposed" and s["state"] == "waiting")
        assert session["host"] == "0.0.0.0"
        report = run_doctor(ray_cluster.address, check_debug=True, record=False, timeout=60)
        exposed = [c for c in report.checks if c.name == "debug server bind"]
        assert exposed and exposed[0].status == "warn" and session["id"] in exposed[0].detail
        per_node = [c for c in report.checks if c.name == "debugpy on node"]
        assert len(per_node) == 2 and all(c.status == "ok" for c in per_node)
        with socket.create_connection(("127.0.0.1", session["port"]), timeout=60) as connection:
            connection.sendall(Path(session["secret_file"]).read_text().encode() + b"c\n")  # commands with it
            _read_until(connection, b"(rs-pdb) ")
            _read_until(connection, b"session closed")
        assert ray.get(ref, timeout=60)["after"] == 4243 + 1
    finally:
        _kill([actor])
