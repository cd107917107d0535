"""Victim: a job that uses raysleuth on a cluster it does not own, then ends; and a look at the agents after.

``python -m victims.agents_lifetime job GCS`` connects to the cluster at GCS,
runs an actor that logs a warning through raysleuth (its client registers
with the writer under this job), waits for the writer to make the node
agents, then stays alive well past the agents' grace (they must stay), and
prints ``{"made": [...], "while_alive": [...]}``.

``python -m victims.agents_lifetime look GCS SECONDS`` connects as a driver
that uses no raysleuth (it never asks for agents) and waits up to SECONDS for
the agents to be gone; prints ``{"left": [...], "after_s": ..., "writer":
{...}}``.
"""

from __future__ import annotations

import json
import sys
import time

import ray


def _agents() -> list[str]:
    from raysleuth.cluster.own import AGENT_PREFIX, NAMESPACE

    return sorted(entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                  if entry["name"].startswith(AGENT_PREFIX) and entry["namespace"] == NAMESPACE)


@ray.remote(num_cpus=0)
class Trainer:
    def step(self) -> int:
        import raysleuth as rs

        rs.get_logger("trainer").warning("loss spiked at step 3", extra={"step": 3})
        from raysleuth.recorder import flush

        flush(30)
        return 3


def job(address: str) -> dict:
    from raysleuth.agents.lifetime import IDLE_S

    ray.init(address=address, logging_level="ERROR")
    trainer = Trainer.remote()
    assert ray.get(trainer.step.remote(), timeout=120) == 3
    deadline = time.monotonic() + 60
    while not (made := _agents()) and time.monotonic() < deadline:  # the writer makes them on its next round
        time.sleep(0.5)
    time.sleep(IDLE_S + 8)  # past the grace and a writer round: this job is alive, so they stay
    return {"made": made, "while_alive": _agents()}


def look(address: str, seconds: float) -> dict:
    from raysleuth.cluster.own import NAMESPACE, WRITER_NAME

    ray.init(address=address, logging_level="ERROR")
    started = time.monotonic()
    while (left := _agents()) and time.monotonic() - started < seconds:
        time.sleep(0.5)
    writer = ray.get(ray.get_actor(WRITER_NAME, namespace=NAMESPACE).info.remote(), timeout=60)
    return {"left": left, "after_s": round(time.monotonic() - started, 1), "writer": writer}


if __name__ == "__main__":
    result = job(sys.argv[2]) if sys.argv[1] == "job" else look(sys.argv[2], float(sys.argv[3]))
    print(json.dumps(result), flush=True)
