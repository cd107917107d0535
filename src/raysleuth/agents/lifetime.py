"""When the node agents go: once no job that used raysleuth is alive (the writer retires them).

An agent runs tools and reads files for raysleuth (narrowed by
:mod:`raysleuth.agents.guard`), so it should not outlive the jobs it serves.
The writer decides, every few seconds (:meth:`Lifetime.step`): agents are
*wanted* while a job that used raysleuth is alive, a job being the one that
made the writer, one that wrote evidence (its clients' batch headers) or one
that asked for agents (a ``raysleuth`` command:
:func:`raysleuth.agents.get_agents` tells the writer), or while evidence
still arrives (a detached actor of an ended job writing
on). Once they have not been wanted for :data:`IDLE_S` seconds, the writer
has every agent forward its node's spool one last time, then removes them.
The next job or command that needs agents makes them again.

The decision is pure logic (:func:`wanted`, :class:`Lifetime`); the writer
(``raysleuth.recorder.writer``) reads the job table and calls
:func:`kill_agents`. The listing and removal of agents live here too.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from raysleuth.cluster.own import AGENT_PREFIX, NAMESPACE, WRITER_NAME
from raysleuth.errors import ClusterUnreachable

__all__ = ["IDLE_S", "Lifetime", "existing_agents", "kill_agents", "remove_agents", "wanted"]

# recorder.writer's AGENTS_CONTROL, by value: the writer makes agents, so importing it here would close an
# import loop. The names of raysleuth's own actors come from their one list, cluster.own.
_AGENTS_CONTROL = "agents"

IDLE_S = float(os.environ.get("RAYSLEUTH_AGENTS_IDLE_S", "60"))
"""Seconds with no job of raysleuth's alive (and no evidence arriving) before the agents go
(``RAYSLEUTH_AGENTS_IDLE_S``)."""


def wanted(jobs: set[str], alive: set[str] | None, last_delivery: float | None, now: float,
           idle_s: float = IDLE_S) -> bool:
    """Whether the agents are still wanted.

    ``jobs``: the jobs that used raysleuth (wrote evidence, or asked for agents); ``alive``: the jobs whose
    driver is alive (None: the job table could not be read, so keep them); ``last_delivery``: when evidence
    last arrived (a Unix time). No job known yet (a writer just made) keeps them, as does any doubt.
    """
    if alive is None or not jobs or jobs & alive:
        return True
    return last_delivery is not None and now - last_delivery < idle_s


Action = Literal["keep", "wait", "retire", "retired"]


class Lifetime:
    """The writer's view of its agents over time: keep them, wait out the grace, retire them once."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self.unwanted_since: float | None = None
        self.retired = False

    def step(self, want: bool, now: float) -> Action:
        """What to do this round (``now``: a monotonic clock). ``retire`` comes once per unwanted spell."""
        if want:
            self.unwanted_since, self.retired = None, False
            return "keep"
        if self.retired:
            return "retired"
        if self.unwanted_since is None:
            self.unwanted_since = now
        if now - self.unwanted_since < self.idle_s:
            return "wait"
        self.retired = True
        return "retire"


_noted: set[tuple[str, str]] = set()
"""(Ray session, job) pairs that told the writer they use agents."""


def _note_user(session: str, names: list[str]) -> None:
    """Tell the writer, once per job, that this job uses the agents: they stay while it is alive (no wait).

    ``names``: raysleuth's named actors now (:func:`_own_names`): with no writer among them there is nobody
    to tell (and nothing retires agents), so nothing is looked up.
    """
    import ray

    if WRITER_NAME not in names:
        return
    try:
        key = (session, ray.get_runtime_context().get_job_id())
        if key not in _noted:
            _noted.add(key)  # once, even if the writer is of another raysleuth version and refuses it
            ray.get_actor(WRITER_NAME, namespace=NAMESPACE).note_agent_user.remote(key[1])
    except Exception:
        pass


def _own_names() -> list[str]:
    """The names of raysleuth's named actors (its namespace), from one listing."""
    import ray

    names = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry.get("name", "") if isinstance(entry, dict) else str(entry)
        if not isinstance(entry, dict) or entry.get("namespace") == NAMESPACE:
            names.append(name)
    return sorted(names)


def _agent_names(names: list[str] | None = None) -> list[str]:
    """The agents among ``names`` (default: listed now)."""
    return [name for name in (_own_names() if names is None else names) if name.startswith(AGENT_PREFIX)]


def existing_agents() -> list[Any]:
    """Handles of the agents that exist now (none is created)."""
    import ray

    handles = []
    for name in _agent_names():
        try:
            handles.append(ray.get_actor(name, namespace=NAMESPACE))
        except ValueError:
            continue
    return handles


def remove_agents() -> list[str]:
    """Remove every node's agent (the documented cleanup); returns the names removed.

    Agents otherwise live while a job that uses raysleuth does (the writer
    retires them after: :class:`Lifetime`). The writer then stops
    making them; a command that needs an agent (``raysleuth stacks``...) makes
    it again, and the writer asks the agents that exist to forward spools.
    """
    import ray

    if not ray.is_initialized():
        raise ClusterUnreachable("not connected to Ray", fix="connect first (raysleuth.cluster.connect)")
    try:
        writer = ray.get_actor(WRITER_NAME, namespace=NAMESPACE)
        ray.get(writer.set_control.remote(_AGENTS_CONTROL, "removed"), timeout=30)
    except Exception:
        pass  # no writer: nothing makes agents again
    return kill_agents()


def kill_agents() -> list[str]:
    """Kill every node's agent now (no restart); returns the names killed. :func:`remove_agents` also keeps the
    writer from making them again; the writer itself calls this when it retires them (:class:`Lifetime`)."""
    import ray

    removed = []
    for name in _agent_names():
        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
            removed.append(name)
        except Exception:
            continue
    return removed
