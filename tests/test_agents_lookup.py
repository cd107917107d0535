"""A fan-out finds every node's agent with one listing, and looks up only the agents it has not seen."""

from __future__ import annotations

import ray

from raysleuth.agents import call_agents, get_agents


def test_a_second_fan_out_looks_nothing_up(ray_cluster, monkeypatch):
    first = get_agents()
    assert len(first) == 2  # the shared 2-node cluster: one agent each
    looked_up = []
    real = ray.get_actor
    monkeypatch.setattr(ray, "get_actor", lambda *args, **kwargs: looked_up.append(args) or real(*args, **kwargs))
    again = get_agents()
    assert looked_up == [] and {node: handle for node, (handle, _) in again.items()} == \
        {node: handle for node, (handle, _) in first.items()}
    answers = call_agents("ping", timeout=30)
    assert len(answers) == 2 and all(answer.ok for answer in answers), answers
    assert looked_up == []
