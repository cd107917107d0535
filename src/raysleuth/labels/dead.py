"""Ranks of actors and workers that are gone (issue 18 fills this in).

Interface kept stable for the other features: ``dead_worker_labels()``
returns, per actor id, a dict with at least ``actor_id``, ``pid``,
``node_ip``, ``node_id``, ``actor_class``, ``actor_name``, ``rank``,
``rank_source`` (None when unknown), and where known ``world_size``.
"""

from __future__ import annotations

from typing import Any


def dead_worker_labels(actors: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Per dead actor id: rank and identity, as best known (from its name only, for now)."""
    from raysleuth import cluster

    if actors is None:
        actors = list(cluster.actors(state="DEAD"))
    labels: dict[str, dict[str, Any]] = {}
    for actor in actors:
        rank = cluster.rank_from_name(actor.get("name"))
        labels[actor.get("actor_id")] = {
            "actor_id": actor.get("actor_id"),
            "pid": actor.get("pid"),
            "node_id": actor.get("node_id"),
            "node_ip": None,
            "actor_class": (actor.get("class_name") or "").rsplit(".", 1)[-1] or None,
            "actor_name": actor.get("name") or None,
            "rank": rank,
            "rank_source": "actor name" if rank is not None else None,
        }
    return labels
