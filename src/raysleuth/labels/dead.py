"""Ranks of actors and workers that are gone.

A dead process cannot be asked, so its rank comes from what outlived it,
most specific first (each named in ``rank_source``):

1. ``registered`` — the rank raysleuth's own instruments recorded for that
   actor id / pid in the evidence store (``rs.set_rank``, the zero-code setup);
2. ``runtime_env`` — ``RANK`` in the actor's creation ``runtime_env``
   ``env_vars`` (plain DDP-in-actors jobs; the State API keeps it for dead actors);
3. ``ray train`` — Ray Train's structured worker logs (``logs/train/
   ray-train-sys-worker-*.log``: ``world_rank`` per ``actor_id``), read
   through Ray's log API from the node, which outlives the worker;
4. ``actor name`` — a rank written into the name (verl's ``..._0:3``).

Interface kept stable for the other features: ``dead_worker_labels()``
returns, per actor id, a dict with at least ``actor_id``, ``pid``,
``node_ip``, ``node_id``, ``actor_class``, ``actor_name``, ``rank``,
``rank_source`` (None when unknown), and where known ``world_size``,
``local_rank``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from raysleuth import cluster
from raysleuth.agents import call_agents
from raysleuth.recorder import open_store

if TYPE_CHECKING:
    from raysleuth.cluster.records import RayActor

__all__ = ["dead_worker_labels", "env_rank", "ray_train_ranks", "store_ranks"]


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def env_rank(env_vars: Mapping[str, str]) -> dict[str, Any]:
    """``rank``/``world_size``/``local_rank`` from a runtime_env's env_vars (empty when no RANK)."""
    rank = _int(env_vars.get("RANK"))
    if rank is None:
        return {}
    return {"rank": rank, "world_size": _int(env_vars.get("WORLD_SIZE")), "local_rank": _int(env_vars.get("LOCAL_RANK"))}


def ray_train_ranks(lines: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per actor id, ``world_rank``/``local_rank``/``pid`` from Ray Train's structured worker log lines."""
    found: dict[str, dict[str, Any]] = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{") or "world_rank" not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        actor_id = entry.get("actor_id")
        rank = _int(entry.get("world_rank"))
        if actor_id and rank is not None:
            found[actor_id] = {"rank": rank, "local_rank": _int(entry.get("local_rank")),
                               "pid": _int(entry.get("process") or entry.get("pid"))}
    return found


def store_ranks(records: Iterable[Any]) -> tuple[dict[str, int], dict[tuple[str | None, int | None], int]]:
    """Ranks the store's records carry: ``(by actor id, by (node_ip, pid))`` (newest record wins)."""
    by_actor: dict[str, int] = {}
    by_pid: dict[tuple[str | None, int | None], int] = {}
    for record in records:
        if getattr(record, "rank", None) is None:
            continue
        if getattr(record, "actor_id", None):
            by_actor[record.actor_id] = record.rank
        if getattr(record, "pid", None):
            by_pid[(record.node_ip, record.pid)] = record.rank
    return by_actor, by_pid


def _store_records(kinds: tuple[str, ...] = ("heartbeat", "crash", "log", "memory", "event"),
                   per_kind: int = 2000) -> list[Any]:
    try:
        store = open_store()
    except Exception:
        return []
    try:
        records = []
        for kind in kinds:
            found = store.query(kind, limit=per_kind, newest_first=True)
            found.reverse()
            records += found
        return records
    except Exception:
        return []
    finally:
        store.close()


def _train_logs(node_ids: set[str]) -> dict[str, dict[str, Any]]:
    """Ray Train worker ranks from the train logs of the given nodes: through the node agents,
    else Ray's log API (nodes that answer neither are skipped)."""

    found: dict[str, dict[str, Any]] = {}
    try:
        for result in call_agents("ray_train_lines", timeout=20, nodes=sorted(node_ids)):
            if result.ok:
                found.update(ray_train_ranks(result.value or []))
                node_ids = node_ids - {result.node_id}
    except Exception:
        pass
    for node_id in node_ids:
        try:
            files = cluster.list_log_files(node_id=node_id, glob_filter="*ray-train-sys-worker*")
        except Exception:
            continue
        for names in files.values():
            for name in names:
                try:
                    found.update(ray_train_ranks(cluster.log_file(node_id=node_id, filename=name, tail=200)))
                except Exception:
                    continue
    return found


def dead_worker_labels(actors: list[RayActor] | None = None) -> dict[str, dict[str, Any]]:
    """Per dead actor id: rank and identity, from the most specific source that has it."""

    if actors is None:
        actors = list(cluster.actors(state="DEAD"))
    try:
        node_ips = {node.node_id: node.node_ip for node in cluster.nodes()}
    except Exception:
        node_ips = {}
    by_actor, by_pid = store_ranks(_store_records()) if actors else ({}, {})
    train_nodes = {actor.node_id for actor in actors if "RayTrainWorker" in (actor.class_name or "") and actor.node_id}
    train = _train_logs(train_nodes) if train_nodes else {}
    labels: dict[str, dict[str, Any]] = {}
    for actor in actors:
        actor_id = actor.actor_id
        node_ip = node_ips.get(actor.node_id)
        entry = {
            "actor_id": actor_id, "pid": actor.pid, "node_id": actor.node_id, "node_ip": node_ip,
            "actor_class": (actor.class_name or "").rsplit(".", 1)[-1] or None,
            "actor_name": actor.name or None, "rank": None, "rank_source": None,
            "world_size": None, "local_rank": None,
        }
        from_env = env_rank(actor.env_vars)
        registered = by_actor.get(actor_id, by_pid.get((node_ip, actor.pid)))
        if registered is not None:
            entry.update(rank=registered, rank_source="registered")
            entry["world_size"] = from_env.get("world_size")
        elif from_env:
            entry.update(from_env, rank_source="runtime_env")
        elif actor_id in train:
            entry.update(rank=train[actor_id]["rank"], local_rank=train[actor_id]["local_rank"],
                         rank_source="ray train")
        else:
            rank = cluster.rank_from_name(actor.name)
            if rank is not None:
                entry.update(rank=rank, rank_source="actor name")
        labels[actor_id] = entry
    return labels
