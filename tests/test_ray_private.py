"""Every private Ray name raysleuth uses exists in the installed Ray; a missing one is a clear error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import ray

from raysleuth import ray_private
from raysleuth.ray_private import RayInternalsChanged


def test_each_private_name_exists_in_this_ray():
    assert callable(ray_private.gcs_client_class())
    assert callable(ray_private.require("ray._raylet", "Config", "initialize"))
    assert callable(ray_private.services().get_ray_address_from_environment)
    assert ray_private.global_worker() is not None
    assert callable(ray_private.actor_method_executor_maker())
    assert callable(ray_private.require(ray_private.RAY_TRAIN_THREAD_RUNNER, "construct_user_exception_with_traceback"))
    assert ray_private.require("ray._private.worker", "_global_node") is None or callable(
        ray_private.global_node().get_logs_dir_path)
    assert callable(ray_private.require("ray._private.worker", "get_dashboard_url"))
    remote_function, actor_method = ray_private.submission_classes()
    assert callable(remote_function._remote) and callable(actor_method._remote)
    assert callable(ray_private.require("ray.remote_function", "RemoteFunction", "_remote"))


def test_the_job_table_names_this_driver_alive(ray_cluster):
    assert ray.get_runtime_context().get_job_id() in ray_private.live_jobs()


def test_a_missing_name_says_what_and_which_ray():
    with pytest.raises(RayInternalsChanged) as caught:
        ray_private.require("ray._raylet", "NoSuchClientAnyMore")
    text = str(caught.value)
    assert "ray._raylet.NoSuchClientAnyMore" in text and ray.__version__ in text and "2.60" in text
    with pytest.raises(RayInternalsChanged, match="__ray_call__"):
        ray_private.ray_call(object(), print)
    with pytest.raises(RayInternalsChanged, match="_actor_id"):
        ray_private.actor_id_hex(object())
    with pytest.raises(RayInternalsChanged, match="ActorMethod._actor"):
        ray_private.actor_of_method(object())
    assert ray_private.remote_function_body(print) is None  # not a remote function: left to the caller
    moved = ray.remote(_double)
    del moved._function  # a Ray that keeps the function elsewhere
    with pytest.raises(RayInternalsChanged, match="RemoteFunction._function"):
        ray_private.remote_function_body(moved)
    assert RayInternalsChanged.exit_code == 2  # a RaySleuthError: the CLI prints one line


class Counter:
    def __init__(self) -> None:
        self.value = 41

    def read(self) -> int:
        return self.value


def _double(x: int) -> int:
    return 2 * x


def _triple(x: int) -> int:
    return 3 * x


def test_live_actor_names_work(ray_cluster):
    from raysleuth import cluster

    handle = ray.remote(num_cpus=0)(Counter).remote()
    try:
        assert ray.get(ray_private.ray_call(handle, lambda self, extra: self.value + extra, 1), timeout=120) == 42
        assert len(ray_private.actor_id_hex(handle)) == 32
        assert any(node.is_head_node for node in cluster.nodes(alive_only=True))  # found by the head resource
        assert ray_private.function_execution_table() is not None  # the driver's worker has the table too
        assert ray_private.actor_id_hex(ray_private.actor_of_method(handle.read)) == ray_private.actor_id_hex(handle)
        assert ray_private.submission_label("actor_call", handle.read) == "Counter.read"
        remote = ray.remote(num_cpus=0)(_double)
        assert ray_private.remote_function_body(remote) is _double
        assert ray_private.set_remote_function_body(remote, _triple)  # not shipped yet: replaced
        assert ray.get(remote.remote(2), timeout=120) == 6
        assert ray_private.submission_label("task", remote) == "_triple"  # Ray describes it at the first call
        assert not ray_private.set_remote_function_body(remote, _double)  # shipped: the caller warns
    finally:
        ray.kill(handle)


PRIVATE_NAMES = re.compile(
    r"ray\._private|ray\._raylet|__ray_call__\.remote|\._actor_id\b|\._actor\b|\._function\b|_make_actor_method_executor"
    r"|\._internal\.|_function_descriptor|\._method_name\b|_pickled_function|_ray_actor_creation|_global_node")


def test_no_private_ray_name_outside_ray_private():
    """A Ray upgrade must fail in one module, with RayInternalsChanged: no other module touches Ray's private names."""
    source = Path(ray_private.__file__).parent
    found = [f"{path.relative_to(source)}:{number}: {line.strip()}"
             for path in sorted(source.rglob("*.py")) if path.name != "ray_private.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if PRIVATE_NAMES.search(line)]
    assert not found, "\n".join(found)
