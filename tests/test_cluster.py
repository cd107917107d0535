"""Connecting: addresses, fast failures, token authentication, State API."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raysleuth import cluster
from raysleuth.errors import ClusterUnreachable, UsageError

HERE = Path(__file__).parent
RAYSLEUTH = [sys.executable, "-m", "raysleuth"]


def test_rank_from_name():
    assert cluster.rank_from_name("trainer_rank3") == 3
    assert cluster.rank_from_name("rank-12") == 12
    assert cluster.rank_from_name("actor_rollout_WorkerDict_0:5") == 5
    assert cluster.rank_from_name("reward-model") is None
    assert cluster.rank_from_name(None) is None


def test_ray_client_address_is_a_usage_error():
    with pytest.raises(UsageError):
        cluster.resolve_address("ray://10.0.0.1:10001")


def test_find_auth_token_never_returns_the_token(tmp_path):
    token_file = tmp_path / "tok"
    token_file.write_text("s3cr3t-token-value")
    assert cluster.find_auth_token({"RAY_AUTH_TOKEN": "abc"}, home=tmp_path) == "RAY_AUTH_TOKEN"
    found = cluster.find_auth_token({"RAY_AUTH_TOKEN_PATH": str(token_file)}, home=tmp_path)
    assert "s3cr3t" not in found and str(token_file) in found
    assert cluster.find_auth_token({}, home=tmp_path) is None


def _cli(args, env=None, timeout=60):
    started = time.monotonic()
    done = subprocess.run(RAYSLEUTH + args, capture_output=True, text=True, timeout=timeout, env=env)
    return done, time.monotonic() - started


def test_unreachable_address_fails_fast_with_one_line():
    done, seconds = _cli(["doctor", "--address", "127.0.0.1:1", "--json"])
    assert done.returncode == 1
    assert seconds < 20
    import json

    report = json.loads(done.stdout)
    reach = next(c for c in report["checks"] if c["name"] == "cluster reachable")
    assert reach["status"] == "fail" and "127.0.0.1:1" in reach["detail"] and reach["fix"]


def test_connect_to_running_cluster_is_quick(ray_cluster):
    code = (
        "import time, sys; t = time.monotonic(); from raysleuth import cluster;"
        f"info = cluster.connect({ray_cluster.address!r}); n = len(cluster.nodes());"
        "print(n, info.session_name, round(time.monotonic() - t, 2))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    nodes, session, seconds = done.stdout.split()
    assert nodes == "2" and session.startswith("session_")
    assert float(seconds) < 6  # about a second on an idle machine; this one is shared


def test_state_listings(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Named:
        def ping(self):
            return 1

    actor = Named.options(name="trainer_rank7").remote()
    ray.get(actor.ping.remote())
    from raysleuth.labels.live import registered_labels

    labels = registered_labels()
    mine = [entry for entry in labels.values() if entry.get("actor_name") == "trainer_rank7"]
    assert mine and mine[0]["rank"] == 7 and mine[0]["actor_class"] == "Named"
    listing = cluster.actors(state="ALIVE")
    assert not listing.truncated and any(a.name == "trainer_rank7" for a in listing)
    assert {n.is_head_node for n in cluster.nodes()} == {True, False}
    ray.kill(actor)


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory):
    """A separate one-node Ray that requires a token (what Ray 2.5x does by default)."""
    home = tmp_path_factory.mktemp("token_home")
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="raysleuth-test-token-0123456789abcdef",
               HOME=str(home))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, str(HERE / "victims" / "token_cluster.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True)
    address = proc.stdout.readline().strip()
    assert address, "token cluster did not start"
    yield address, home
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def _client_env(home, **extra):
    env = {key: value for key, value in os.environ.items()
           if key not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")}
    env["HOME"] = str(home)  # no ~/.ray/auth_token there
    env["RAYSLEUTH_HOME"] = str(home / "raysleuth")  # another cluster: its evidence must not land in the session's home
    env.update(extra)
    return env


def _timed_connect(address, env):
    """Seconds spent inside connect() alone (imports excluded: this machine may be loaded)."""
    code = (
        "import time, ray\nfrom raysleuth import cluster\nfrom raysleuth.errors import RaySleuthError\n"
        "t = time.monotonic()\ntry:\n    cluster.connect(%r)\n    print('connected')\n"
        "except RaySleuthError as error:\n    print(error)\nprint(time.monotonic() - t)\n" % address
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    lines = done.stdout.strip().splitlines()
    return lines[0], float(lines[-1]), done.stdout + done.stderr


def test_missing_token_fails_fast_with_the_fix(token_cluster, tmp_path):
    address, _ = token_cluster
    message, seconds, output = _timed_connect(address, _client_env(tmp_path))
    assert seconds < 8, f"connect took {seconds:.1f}s: Ray's own retries take ~20s"
    assert "requires token authentication" in message and "auth_token" in message
    assert "raysleuth-test-token" not in output
    done, _ = _cli(["doctor", "--address", address, "--json"], env=_client_env(tmp_path))
    assert done.returncode == 1
    assert "requires token authentication" in done.stdout


def test_token_from_file_is_found_and_never_printed(token_cluster, tmp_path):
    address, _ = token_cluster
    token_file = tmp_path / "token"
    token_file.write_text("raysleuth-test-token-0123456789abcdef")
    env = _client_env(tmp_path, RAY_AUTH_TOKEN_PATH=str(token_file))
    done, _ = _cli(["doctor", "--address", address, "--json", "--timeout", "60"], env=env, timeout=120)
    import json

    report = json.loads(done.stdout)
    checks = {c["name"]: c for c in report["checks"] if c["node"] is None}
    assert checks["cluster reachable"]["status"] == "ok", checks["cluster reachable"]
    # raysleuth found the token, but a job started from this environment (RAY_ADDRESS, no RAY_AUTH_MODE) fails
    assert checks["token authentication"]["status"] == "warn", checks["token authentication"]
    assert "RAY_AUTH_MODE" in checks["token authentication"]["fix"]
    assert "raysleuth-test-token" not in done.stdout + done.stderr
    done, _ = _cli(["doctor", "--address", address, "--json", "--timeout", "60"],
                   env={**env, "RAY_AUTH_MODE": "token"}, timeout=120)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"] if c["node"] is None}
    assert checks["token authentication"]["status"] == "ok", checks["token authentication"]


_JOB = "import ray\nray.init()\nprint('job connected to', ray.get_runtime_context().gcs_address, flush=True)\n"


def test_run_address_passes_token_mode_to_the_job(token_cluster, tmp_path):
    """`raysleuth run --address` on a token cluster: the job's ray.init needs RAY_AUTH_MODE=token (issue 29)."""
    address, _ = token_cluster
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("raysleuth-test-token-0123456789abcdef")
    done = subprocess.run([sys.executable, "-m", "raysleuth", "run", "--address", address, "--", sys.executable,
                           "-c", _JOB], capture_output=True, text=True, env=_client_env(tmp_path), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"job connected to {address}" in done.stdout
    assert "raysleuth-test-token" not in done.stdout + done.stderr
    missing = tmp_path / "no_token"
    missing.mkdir()
    done = subprocess.run([sys.executable, "-m", "raysleuth", "run", "--address", address, "--", sys.executable,
                           "-c", _JOB], capture_output=True, text=True, env=_client_env(missing), timeout=120)
    assert done.returncode == 2 and "requires token authentication" in done.stderr, done.stderr[-2000:]


def test_wrong_token_is_reported_as_rejected(token_cluster, tmp_path):
    address, _ = token_cluster
    env = _client_env(tmp_path, RAY_AUTH_TOKEN="not-the-right-token-at-all-000000")
    message, seconds, output = _timed_connect(address, env)
    assert seconds < 8
    assert "rejected the token from RAY_AUTH_TOKEN" in message
    assert "not-the-right-token" not in output


def test_token_cluster_connect_prints_no_native_auth_warnings(token_cluster, tmp_path):
    """raysleuth's own token-less probe makes Ray's C++ client warn; the user must not see it."""
    address, _ = token_cluster
    token_file = tmp_path / "token"
    token_file.write_text("raysleuth-test-token-0123456789abcdef")
    env = _client_env(tmp_path, RAY_AUTH_TOKEN_PATH=str(token_file))
    done, _ = _cli(["doctor", "--address", address, "--json", "--timeout", "60"], env=env, timeout=120)
    assert "gcs_client.cc" not in done.stderr and "InvalidAuthToken" not in done.stderr, done.stderr[-2000:]
