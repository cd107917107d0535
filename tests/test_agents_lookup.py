"""A fan-out finds every node's agent with one listing, and looks up only the agents it has not seen."""

from __future__ import annotations

import ray

from raysleuth.agents import call_agents, get_agents


def test_a_second_fan_out_looks_nothing_up(ray_cluster, monkeypatch):
    from raysleuth.recorder import get_writer

    get_writer()  # the first fan-out tells the writer this job uses agents (once: the second looks nothing up)
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


def test_a_call_an_agent_does_not_take_is_an_answer_with_the_fix_not_a_traceback(ray_cluster):
    # an agent made by another raysleuth (agents outlive the command that made them) lacks a method...
    answers = call_agents("no_such_method", timeout=30)
    assert len(answers) == 2 and not any(answer.ok for answer in answers)
    assert all(answer.error.startswith("AttributeError") and "remove_agents()" in answer.error for answer in answers)
    # ...or takes fewer arguments (run_tools before its interrupt_s): the same, for that node only
    [node, *_] = sorted(get_agents())
    answers = call_agents("run_tools", [["ps"]], 5.0, timeout=30,
                          per_node_args={node: ([["ps"]], 5.0, 1, 0.0, "one too many")})
    by_node = {answer.node_id: answer for answer in answers}
    assert "TypeError" in by_node[node].error and "remove_agents()" in by_node[node].error, by_node[node]
    assert all(answer.ok for node_id, answer in by_node.items() if node_id != node)
    # a refusal of the agent's own is told as it is, with no word of versions
    [refused, *_] = call_agents("run_tool", ["/bin/sh", "-c", "true"], timeout=30)
    assert "PermissionDenied" in refused.error and "remove_agents()" not in refused.error, refused.error
