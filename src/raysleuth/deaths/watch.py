"""Record deaths as they happen, so a SIGKILLed rank is not forgotten once the job (and its cluster) ends.

Two watchers, both cheap, both calling :func:`record_new_deaths` (which
classifies with :func:`~raysleuth.deaths.find_deaths` and stores with
:func:`~raysleuth.deaths.record_deaths` only when a dead actor is not yet in
the run's evidence):

- **in the writer**: :func:`start_death_watch` starts one daemon thread in
  the run's writer actor (through ``__ray_call__``: no process of its own)
  that polls Ray's dead actors every :data:`WATCH_S` seconds while the
  cluster lives. One State API listing per poll; classification (logs, the
  node agents' OOM reading) only for a new death. Zero-code workers start it
  (``raysleuth run``, the setup hook).
- **at the driver's exit**: :func:`last_look` runs from the interpreter's
  thread exit hooks (while thread pools still take work) in a
  driver under ``raysleuth run``, before Ray's own shutdown (which, for a
  cluster the driver started, takes the cluster down): a rank that died a
  moment before the job ended is still classified and stored. It has a
  deadline (:data:`LAST_LOOK_S`) and never raises.

Scaling note: the poll lists every dead actor of the cluster (a filter by
state, done by the GCS); past tens of thousands of dead actors, poll by job
or use the GCS's actor pubsub instead.
"""

from __future__ import annotations

import threading
import time

from raysleuth import cluster, ray_private
from raysleuth.cluster import own
from raysleuth.deaths import _recorded_keys, find_deaths, record_deaths
from raysleuth.recorder import get_writer

__all__ = ["LAST_LOOK_S", "WATCH_S", "last_look", "record_new_deaths", "start_death_watch"]

#: Seconds between two polls of Ray's dead actors in the writer.
WATCH_S = 1.0
#: At most this long at the driver's exit for the last look.
LAST_LOOK_S = 30.0


#: Dead actors classified this many times without a stored death are left alone (no endless re-reading).
_MAX_TRIES = 3
_tries: dict[str, int] = {}


def _unrecorded_dead(job_id: str | None = None) -> set[str]:
    """Actor ids of dead actors (not raysleuth's own; of ``job_id`` when given) the run has no death for yet."""
    cluster.pin_address()  # a job started with RAY_ADDRESS=local: the State API would look for "local" anew
    dead = {actor.actor_id for actor in cluster.actors(state="DEAD")
            if (job_id is None or actor.job_id == job_id) and not own.is_own(name=actor.name,
                                                                             class_name=actor.class_name)}
    return {actor_id for actor_id in (dead - _recorded_keys() if dead else set())
            if _tries.get(actor_id, 0) < _MAX_TRIES}


def record_new_deaths(*, timeout: float = 15.0, job_id: str | None = None) -> int:
    """Classify and store the deaths not yet in the run's evidence (of one job: ``job_id``); returns how many
    were stored. Never raises."""
    try:
        new = _unrecorded_dead(job_id)
        if not new:
            return 0
        for actor_id in new:
            _tries[actor_id] = _tries.get(actor_id, 0) + 1

        return record_deaths(find_deaths(timeout=timeout, lines=10, job_id=job_id))
    except Exception:
        return 0


def _watch(interval: float) -> None:
    while True:
        time.sleep(interval)
        record_new_deaths()


def _install(writer: object, interval: float) -> bool:
    """Runs inside the writer actor: start its death-watch thread once (True when it was started now)."""
    if getattr(writer, "_death_watch", None) is not None:
        return False
    thread = threading.Thread(target=_watch, args=(interval,), name="raysleuth-death-watch", daemon=True)
    writer._death_watch = thread  # type: ignore[attr-defined]
    thread.start()
    return True


_started = threading.Event()
_asked: list = []  # the install call sent to the writer and not answered yet (its ObjectRef)
_asking = threading.Lock()


def start_death_watch(*, interval: float = WATCH_S, wait: float = 10.0) -> bool | None:
    """Make sure the run's writer watches for deaths (once per process; needs a connected Ray). Never raises.

    True: it watches. None: asked, and the writer has not answered within ``wait`` seconds (a writer still
    starting on a loaded node): the request stands, and a later call (``wait=0`` to only look) sees its answer
    instead of asking again. False: it cannot here (no Ray, no writer, or the call failed).
    """
    if _started.is_set():
        return True
    try:
        import ray

        with _asking:
            if not _asked:
                _asked.append(ray_private.ray_call(get_writer(), _install, interval))
            asked = _asked[0]
        ready, _ = ray.wait([asked], timeout=wait)
        if not ready:
            return None
        with _asking:
            _asked.clear()
        ray.get(asked)
        _started.set()
        return True
    except Exception:
        with _asking:
            _asked.clear()
        return False


def last_look(deadline: float = LAST_LOOK_S) -> int:
    """At a driver's exit: store the deaths not recorded yet, within ``deadline`` seconds. Never raises."""
    try:
        import ray

        if not ray.is_initialized():
            return 0
    except Exception:
        return 0
    try:
        job_id = ray.get_runtime_context().get_job_id()  # this driver's job only: older deaths are not its own
    except Exception:
        job_id = None
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(record_new_deaths(timeout=deadline, job_id=job_id)),
                              daemon=True, name="raysleuth-last-look")
    worker.start()
    worker.join(deadline)
    return result[0] if result else 0
