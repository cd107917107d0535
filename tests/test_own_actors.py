"""raysleuth's own actors are recognised by one list (cluster.own) in every form a caller meets them (issue 28)."""

from __future__ import annotations

import pytest

from raysleuth.cluster import own


@pytest.mark.parametrize("form", [
    {"name": "raysleuth-writer"}, {"name": "raysleuth-agent-3f2a9c01d4e5b6a7"}, {"namespace": "raysleuth"},
    {"class_name": "EvidenceWriter"}, {"class_name": "raysleuth.agents.NodeAgent"},
    {"class_name": "NodeAgent.run_tool"}, {"class_name": "EvidenceWriter.write"},
])
def test_every_form_of_an_own_actor_is_own(form):
    assert own.is_own(**form)


@pytest.mark.parametrize("form", [
    {}, {"name": "raysleuth-writer-of-my-own"}, {"name": "rank_0"}, {"class_name": "RayTrainWorker"},
    {"class_name": "Writer"}, {"namespace": "default"}, {"class_name": "MyNodeAgentWrapper.run"},
])
def test_the_users_actors_are_not_own(form):
    assert not own.is_own(**form)


def test_titles_and_the_names_the_writer_and_agents_use():
    from raysleuth import agents
    from raysleuth.recorder import writer

    assert own.is_own_title("ray::NodeAgent.run_tool") and not own.is_own_title("ray::DDPRank.train")
    assert own.is_own(name=writer.WRITER_NAME, namespace=None) and writer.NAMESPACE == own.NAMESPACE
    assert own.is_own(name=agents.AGENT_PREFIX + "0123456789abcdef") and agents.NAMESPACE == own.NAMESPACE
