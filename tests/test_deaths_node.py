"""A rank's node dies (removed from its own 2-node cluster, as when a machine is lost): cause node_died."""

from __future__ import annotations

from own_cluster import run_victim


def test_node_death_is_classified_with_its_rank(tmp_path):
    result = run_victim("node_death", tmp_path, timeout=600)
    death = result["deaths"][0]
    assert (death["rank"], death["rank_source"], death["cause"]) == (1, "runtime_env", "node_died"), death
    assert death["ray_reason"] == "NODE_DIED" and death["evidence"]
