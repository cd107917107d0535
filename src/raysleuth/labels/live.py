"""Ranks of running processes (issue 19 fills this in).

Interface kept stable for the other features: ``worker_labels()`` returns,
per ``(node_ip, pid)``, a dict with at least ``pid``, ``node_ip``,
``node_id``, ``actor_id``, ``actor_class``, ``actor_name``, ``rank``,
``rank_source`` (None when unknown), and where known ``world_size``,
``local_rank``, ``role``.
"""

from __future__ import annotations

from typing import Any


def worker_labels() -> dict[tuple[str | None, int], dict[str, Any]]:
    """Per running worker ``(node_ip, pid)``: rank and identity, as best known."""
    from raysleuth import cluster

    return cluster.worker_labels()
