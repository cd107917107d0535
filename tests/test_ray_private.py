"""Every private Ray name raysleuth uses exists in the installed Ray; a missing one is a clear error."""

from __future__ import annotations

import pytest
import ray

from raysleuth import ray_private
from raysleuth.ray_private import RayInternalsChanged


def test_each_private_name_exists_in_this_ray():
    assert callable(ray_private.gcs_client_class())
    assert callable(ray_private.require("ray._raylet", "Config", "initialize"))
    assert callable(ray_private.services().get_ray_address_from_environment)
    assert ray_private.global_worker() is not None
    assert callable(ray_private.global_worker().function_actor_manager._make_actor_method_executor)
    assert ray_private.require("ray._private.worker", "_global_node") is None or callable(
        ray_private.global_node().get_logs_dir_path)
    assert callable(ray_private.require("ray._private.worker", "get_dashboard_url"))
    remote_function, actor_method = ray_private.submission_classes()
    assert callable(remote_function._remote) and callable(actor_method._remote)
    assert callable(ray_private.require("ray.remote_function", "RemoteFunction", "_remote"))


def test_a_missing_name_says_what_and_which_ray():
    with pytest.raises(RayInternalsChanged) as caught:
        ray_private.require("ray._raylet", "NoSuchClientAnyMore")
    text = str(caught.value)
    assert "ray._raylet.NoSuchClientAnyMore" in text and ray.__version__ in text and "2.60" in text
    with pytest.raises(RayInternalsChanged, match="__ray_call__"):
        ray_private.ray_call(object(), print)
    with pytest.raises(RayInternalsChanged, match="_actor_id"):
        ray_private.actor_id_hex(object())
    assert RayInternalsChanged.exit_code == 2  # a RaySleuthError: the CLI prints one line


class Counter:
    def __init__(self) -> None:
        self.value = 41


def test_live_actor_names_work(ray_cluster):
    from raysleuth import cluster

    handle = ray.remote(num_cpus=0)(Counter).remote()
    try:
        assert ray.get(ray_private.ray_call(handle, lambda self, extra: self.value + extra, 1), timeout=120) == 42
        assert len(ray_private.actor_id_hex(handle)) == 32
        assert any(node.is_head_node for node in cluster.nodes(alive_only=True))  # found by the head resource
        assert ray_private.function_execution_table() is not None  # the driver's worker has the table too
    finally:
        ray.kill(handle)
