"""Ranks of running processes, from outside, from every source there is.

``worker_labels()`` returns, per ``(node_ip, pid)``, a dict with at least
``pid``, ``node_ip``, ``node_id``, ``actor_id``, ``actor_class``,
``actor_name``, ``rank``, ``rank_source`` (None when unknown), and where
known ``world_size``, ``local_rank``, ``role`` and ``rank_note`` (why a
source could not be read).

Sources, most specific first (``rank_source`` names the one that won):

1. ``registered`` — raysleuth's own registration (``rs.set_rank``, pools,
   instrumented verl groups), from the writer;
2. ``ray train`` — Ray Train's structured worker logs on each node
   (``logs/train/ray-train-sys-worker-*.log``: ``world_rank`` + pid), read
   by the node agent; always written, whatever the job enables;
3. ``environment`` (or ``verl environment`` when verl's ``WG_PREFIX`` is
   there) — ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the process's
   start-up environment (``runtime_env`` env_vars, torchrun, verl), read by
   the node agent with psutil, never by the worker;
4. ``actor name`` — ``trainer_rank3``, verl's ``..._0:3``.

A driver never gets a rank. A process whose environment cannot be read
keeps ``rank_source`` None and says why in ``rank_note``.
"""

from __future__ import annotations

from typing import Any

from raysleuth import agents, cluster
from raysleuth.recorder import get_writer

__all__ = ["SOURCES", "apply_notes", "collect_hints", "hints_from_results", "merge_hints", "registered_labels",
           "resolve_rank",
           "worker_labels"]

SOURCES = ("registered", "ray train", "verl environment", "environment", "actor name")
"""Rank sources, most specific first."""


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def resolve_rank(label: dict[str, Any], hint: dict[str, Any] | None) -> dict[str, Any]:
    """Pure: the rank fields for one process from its State API label and its node agent's hint.

    ``label``: what :func:`registered_labels` knows (may carry
    a ``registered`` or ``actor name`` rank). ``hint``: one entry of
    :func:`raysleuth.agents.rank_hints` (``environment``, ``train``, ``note``).
    Returns ``rank``, ``rank_source``, ``world_size``, ``local_rank``, ``rank_note``.
    """
    candidates: dict[str, dict[str, Any]] = {}
    if label.get("rank") is not None and label.get("rank_source"):
        candidates[label["rank_source"]] = {"rank": label["rank"], "world_size": label.get("world_size")}
    hint = hint or {}
    train = hint.get("train") or {}
    if train.get("rank") is not None:
        candidates["ray train"] = {"rank": _int(train["rank"]), "world_size": train.get("world_size"),
                                   "local_rank": _int(train.get("local_rank"))}
    environment = hint.get("environment") or {}
    if _int(environment.get("RANK")) is not None:
        source = "verl environment" if environment.get("WG_PREFIX") else "environment"
        candidates[source] = {"rank": _int(environment["RANK"]), "world_size": _int(environment.get("WORLD_SIZE")),
                              "local_rank": _int(environment.get("LOCAL_RANK"))}
    result: dict[str, Any] = {"rank": None, "rank_source": None, "world_size": label.get("world_size"),
                              "local_rank": label.get("local_rank"), "rank_note": hint.get("note")}
    for source in SOURCES:
        if source in candidates:
            chosen = candidates[source]
            result.update(rank=chosen["rank"], rank_source=source)
            for key in ("world_size", "local_rank"):
                result[key] = chosen.get(key) if chosen.get(key) is not None else result[key]
            break
    # Fill what the winner did not say from the other sources (a registered rank, the env's LOCAL_RANK).
    for source in SOURCES:
        for key in ("world_size", "local_rank"):
            if result[key] is None and candidates.get(source, {}).get(key) is not None:
                result[key] = candidates[source][key]
    if result["rank_source"] is not None:
        result["rank_note"] = None
    return result


def merge_hints(labels: dict[tuple[str | None, int], dict[str, Any]],
                hints: dict[str | None, dict[int, dict[str, Any]]],
                drivers: set[tuple[str | None, int]] | None = None) -> dict[tuple[str | None, int], dict[str, Any]]:
    """Pure: labels with every process's rank resolved; ``hints`` per node ip, per pid."""
    drivers = drivers or set()
    for node_ip, per_pid in hints.items():
        for pid in per_pid:
            labels.setdefault((node_ip, int(pid)), {"pid": int(pid), "node_ip": node_ip})
    for key, label in labels.items():
        if key in drivers:
            label.update(rank=None, rank_source=None, role="driver")
            continue
        hint = hints.get(key[0], {}).get(key[1])
        label.update(resolve_rank(label, hint))
        train = (hint or {}).get("train") or {}
        if label.get("rank_source") == "ray train":
            label.setdefault("role", "ray train worker")
            label["run_name"] = train.get("run_name")
    return labels


def hints_from_results(results: list[Any]) -> tuple[dict, dict[str | None, str], dict[str | None, float]]:
    """Pure: the agents' answers (:class:`raysleuth.agents.AgentResult`) as hints, notes and costs per node ip.

    Several nodes may share one ip (one machine, ``ray.cluster_utils``):
    their workers are merged, pids being unique per machine.
    """
    hints: dict[str | None, dict[int, dict[str, Any]]] = {}
    notes: dict[str | None, str] = {}
    costs: dict[str | None, float] = {}
    for result in results:
        if result.ok:
            hints.setdefault(result.node_ip, {}).update(
                {int(pid): hint for pid, hint in ((result.value or {}).get("processes") or {}).items()})
            costs[result.node_ip] = max(costs.get(result.node_ip, 0.0), (result.value or {}).get("seconds") or 0.0)
        else:
            notes[result.node_ip] = f"node agent did not answer: {result.error}"
    return hints, notes, costs


def collect_hints(timeout: float = 10.0) -> tuple[dict, dict[str | None, str], dict[str | None, float]]:
    """Every node agent's rank hints at once: (hints per node ip, notes per node ip, agent seconds per node ip)."""

    try:
        return hints_from_results(agents.call_agents("rank_hints", timeout=timeout))
    except Exception as error:  # no agents at all: the State API's view is what we have
        return {}, {None: f"node agents unavailable ({type(error).__name__}: {str(error)[:120]})"}, {}


def apply_notes(labels: dict[tuple[str | None, int], dict[str, Any]], notes: dict[str | None, str]) -> None:
    """Say why a process has no rank when its node's agent was not reached."""
    for key, label in labels.items():
        note = notes.get(key[0]) or notes.get(None)
        if note and label.get("rank") is None:
            label["rank_note"] = note


def registered_labels() -> dict[tuple[str | None, int], dict[str, Any]]:
    """Per worker ``(node_ip, pid)``: rank, actor class and name, node, job, as the State API and the writer know.

    Ranks come from what instruments registered with the writer, else from
    actor names (pids repeat across nodes, hence the node in the key). A
    driver never takes a rank from the writer: the rank column of what a
    driver records on behalf of workers (a verl call to rank 1) is theirs.
    :func:`worker_labels` adds Ray Train's records and the processes'
    start-up environment.
    """

    labels: dict[tuple[str | None, int], dict[str, Any]] = {}
    node_ips = {node.node_id: node.node_ip for node in cluster.nodes()}
    for actor in cluster.actors(state="ALIVE"):
        pid = actor.pid
        if not pid:
            continue
        node_ip = node_ips.get(actor.node_id)
        rank = cluster.rank_from_name(actor.name)
        labels[(node_ip, pid)] = {
            "pid": pid,
            "node_ip": node_ip,
            "node_id": actor.node_id,
            "actor_id": actor.actor_id,
            "actor_class": (actor.class_name or "").rsplit(".", 1)[-1] or None,
            "actor_name": actor.name or None,
            "job_id": actor.job_id,
            "rank": rank,
            "rank_source": "actor name" if rank is not None else None,
        }
    try:
        import ray

        for client in ray.get(get_writer(create=False).clients.remote(), timeout=5):
            if client.get("role") == "driver":
                continue  # the driver never inherits a worker's rank
            key = (client.get("node_ip"), client.get("pid"))
            entry = labels.setdefault(key, {"pid": client.get("pid"), "node_ip": client.get("node_ip")})
            if client.get("rank") is not None:
                entry["rank"] = client["rank"]
                entry["rank_source"] = "registered"
                if client.get("world_size"):
                    entry["world_size"] = client["world_size"]
    except Exception:
        pass  # no writer yet: names are all we have
    return labels


def worker_labels(*, timeout: float = 10.0, with_hints: bool = True) -> dict[tuple[str | None, int], dict[str, Any]]:
    """Per running worker ``(node_ip, pid)``: rank and identity from every source (see the module doc).

    Never raises for a node that does not answer: its processes keep what
    the State API knows, and ``rank_note`` says the agent was not reached.
    """
    labels = registered_labels()
    if not with_hints:
        return labels
    hints, notes, _costs = collect_hints(timeout)
    merge_hints(labels, hints)
    apply_notes(labels, notes)
    return labels
