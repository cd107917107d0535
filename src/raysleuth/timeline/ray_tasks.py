"""Ray's task events on the timeline (the State API, while the cluster lives)."""

from __future__ import annotations

from raysleuth import cluster
from raysleuth.labels.live import worker_labels
from raysleuth.timeline.model import Timeline, _label, _Tracks, _us


def _add_ray_tasks(timeline: Timeline, tracks: _Tracks, address: str | None, worker_ranks, ranks, window, jobs):
    try:
        cluster.connect(address)
        nodes = cluster.nodes()
        node_ips = {node.node_id: node.node_ip for node in nodes}
        heads = {node.node_id for node in nodes if node.is_head_node}
        actors = {actor.actor_id: actor for actor in cluster.actors()}
    except Exception as error:
        timeline.warnings.append(f"Ray task events left out: no cluster answered ({str(error)[:160]})")
        return
    for node_id, node_ip in node_ips.items():
        tracks.pid(node_id, node_ip, node_id in heads)
    try:  # ranks of live workers from outside (Ray Train's logs, start-up environment)

        live = {(label.get("node_ip"), pid): label.get("rank") for (_ip, pid), label in worker_labels().items()}
    except Exception:
        live = {}
    try:
        listing, truncated = _task_listing(ranks, worker_ranks, live, node_ips, actors, jobs)
    except Exception as error:
        timeline.warnings.append(f"Ray task events left out: the State API did not answer ({str(error)[:160]})")
        return
    if truncated:
        timeline.warnings.append(f"the State API returned only the first {len(listing)} tasks; older ones are missing")
    for task in listing:
        events = sorted((entry for entry in task.events if entry.created_ms), key=lambda entry: entry.created_ms)
        running = next((entry.created_ms for entry in events if (entry.state or "").startswith("RUNNING")), None)
        start_ms = task.start_time_ms or running
        end_ms = task.end_time_ms or next((entry.created_ms for entry in events
                                           if entry.state in ("FINISHED", "FAILED")), None)
        if not start_ms or not task.worker_pid:
            continue  # never ran (pending tasks are `raysleuth tasks --pending`)
        start, end = float(start_ms) / 1000.0, (float(end_ms) / 1000.0 if end_ms else None)
        if end is None:
            import time as _time

            end = _time.time()
        if window and (end < window[0] or start > window[1]):
            continue
        node_id = task.node_id
        rank = worker_ranks.get((node_id, task.worker_pid))
        actor = actors.get(task.actor_id)
        if rank is None:
            rank = live.get((node_ips.get(node_id), task.worker_pid))
        if rank is None:
            rank = cluster.rank_from_name(actor.name if actor else None)
        if ranks is not None and rank not in ranks:
            continue
        pid = tracks.pid(node_id, node_ips.get(node_id))
        tid = tracks.tid(pid, task.worker_pid, _label(rank, actor.class_name if actor else None, task.worker_pid))
        created = float(task.creation_time_ms or start_ms) / 1000.0
        timeline.events.append({
            "name": task.function or task.name or "task", "cat": "ray_task", "ph": "X",
            "ts": _us(start), "dur": _us(max(0.0, end - start)), "pid": pid, "tid": tid,
            "args": {"task_id": task.task_id, "state": task.state, "type": task.type,
                     "attempt": task.attempt_number, "waited_s": round(max(0.0, start - created), 6),
                     "rank": rank, "error_type": task.error_type},
        })
        timeline.ray_tasks += 1


def _task_listing(ranks, worker_ranks, live, node_ips, actors, jobs=None) -> tuple[list, bool]:
    """Ray's tasks for the timeline, and whether a listing was cut at the State API's limit.

    With ``ranks``: only the tasks of those ranks' actors (known from the
    evidence, live labels or actor names), one query per actor, filtered by
    the GCS itself. A long-lived cluster holds many thousands of finished
    tasks (each listed with its events); listing them all takes seconds and
    may be cut before the ones asked for. Only ranked task workers (not
    actors, not drivers) need the whole listing, once. With ``jobs``: one
    listing per job, filtered by the GCS, and only those jobs' tasks.
    """
    from concurrent.futures import ThreadPoolExecutor


    def everything() -> list:
        if not jobs:
            return [cluster.tasks()]
        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(lambda job: cluster.tasks(job_id=job), sorted(set(jobs))))

    if ranks is None:
        listings = everything()
        return [task for listing in listings for task in listing], any(listing.truncated for listing in listings)
    if jobs:
        actors = {key: actor for key, actor in actors.items() if actor.job_id in jobs}
    node_of_ip = {node_ip: node_id for node_id, node_ip in node_ips.items()}
    wanted = {key for key, rank in worker_ranks.items() if rank in ranks and key[1]}
    wanted |= {(node_of_ip.get(ip), pid) for (ip, pid), rank in live.items() if rank in ranks and pid}
    actor_of = {(actor.node_id, actor.pid): actor.actor_id for actor in actors.values() if actor.pid}
    actor_of.update({(None, actor.pid): actor.actor_id for actor in actors.values() if actor.pid})
    ids = {actor.actor_id for actor in actors.values()
           if actor.pid and cluster.rank_from_name(actor.name) in ranks}
    ids |= {actor_of[key] for key in wanted if key in actor_of}
    others = {key for key in wanted if key not in actor_of}
    if others:  # plain task workers run tasks; drivers and processes Ray no longer knows do not
        task_workers = {(worker.node_id, worker.pid) for worker in cluster.workers(alive_only=False)
                        if worker.worker_type == "WORKER"}
        task_workers |= {(None, pid) for _node, pid in task_workers}
        others &= task_workers
    with ThreadPoolExecutor(max_workers=8) as pool:
        listings = list(pool.map(lambda actor_id: cluster.tasks(actor_id=actor_id), sorted(ids)))
    found = [task for listing in listings for task in listing]
    if others:
        whole = everything()
        listings += whole
        found += [task for listing in whole for task in listing if not task.actor_id and
                  ((task.node_id, task.worker_pid) in others or (None, task.worker_pid) in others)]
    return found, any(listing.truncated for listing in listings)
