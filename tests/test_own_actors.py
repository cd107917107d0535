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


def test_calls_on_the_writer_and_the_agents_leave_no_task_events(ray_cluster):
    """Every worker's control poll, delivery and meeting is a call on raysleuth's own actors, several a second
    a rank: Ray keeps no task event of them (they would evict the job's own from the GCS's bounded store and
    crowd `ray list tasks`). A user actor's calls, made alongside, are listed: the events do flow."""
    import time

    import ray

    from raysleuth import cluster
    from raysleuth.agents import call_agents, get_agents
    from raysleuth.recorder import get_writer

    @ray.remote(num_cpus=0)
    class Neighbour:
        def hello(self) -> int:
            return 1

    neighbour = Neighbour.remote()
    writer = get_writer()
    for _ in range(5):
        assert ray.get(neighbour.hello.remote(), timeout=60) == 1
        ray.get(writer.info.remote(), timeout=60)
        assert all(result.ok for result in call_agents("ping", timeout=60))
    ours = {writer._actor_id.hex()} | {handle._actor_id.hex() for handle, _ip in get_agents().values()}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # task events reach the GCS about a second late
        listed = list(cluster.tasks(detail=False))
        if sum((task.name or "").endswith("Neighbour.hello") for task in listed) >= 5:
            break
        time.sleep(1)
    assert sum((task.name or "").endswith("Neighbour.hello") for task in listed) >= 5
    # by actor id: other tests make EvidenceWriters of their own (a broken one), which keep Ray's default
    assert not [task.name for task in listed if task.actor_id in ours], "raysleuth's own calls left task events"
    ray.kill(neighbour)
