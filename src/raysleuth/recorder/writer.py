"""The writer: one detached, named actor that owns a run's evidence file.

It lives on the head node (it asks for a sliver of the head node's
``node:__internal_head__`` resource and no CPU), restarts when it dies, and
re-opens the same file. Besides writing batches it keeps two small pieces of
shared state that instruments need to meet without NCCL:

- a **registry** of every client that has sent evidence (pid, node, rank,
  actor), so live commands can label processes with ranks;
- **controls**: small JSON values that the CLI sets (``debug arm``) and
  workers poll;
- **mailboxes**: ranks post a value under a topic and read everyone's
  (consistency checks meet here when ``torch.distributed`` is broken).

Spooled evidence: when it starts (or restarts) and then every
:data:`SPOOL_SCAN_S` seconds, the writer stores the spool files of its run
and node whose process is gone (a worker that exited before the writer
could take its last records); every :data:`AGENT_FORWARD_S` seconds it asks
each node's agent (created where missing) to send that node's files
(:meth:`EvidenceWriter.ingest`), so a worker killed on any node keeps its
records in the run while the cluster still runs. Once no job that used
raysleuth has been alive for a while, it has the agents forward one last
time and removes them (:mod:`raysleuth.agents.lifetime`).

Scaling: one writer serialises all inserts (tens of thousands of records a
second, bench/bench_store.py; a commit is about 0.1 ms, so the cost is the
RPCs). Workers read the controls, and poll meeting counts, through their
node's agent (:mod:`raysleuth.agents.controls`), so those reach the writer
once per node; each client's deliveries (one ``write`` per 0.2 s) still
come one per rank. ``info()["calls"]`` counts the RPCs by method;
bench/bench_ingest.py drives it at the 1,000-rank full-mode rate.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path
from typing import Any

from raysleuth import ray_private, runtime
from raysleuth.cluster import own
from raysleuth.errors import ClusterUnreachable
from raysleuth.recorder import spool
from raysleuth.recorder.store import EvidenceStore, open_run

WRITER_NAME = own.WRITER_NAME
NAMESPACE = own.NAMESPACE
#: How often the writer looks for abandoned spool files of its run (seconds).
SPOOL_SCAN_S = 1.0
#: How often the writer asks every node's agent to forward its node's spool (seconds).
AGENT_FORWARD_S = 5.0
#: Control key ``raysleuth.agents.remove_agents`` sets to ``"removed"``: the writer then makes no agents.
AGENTS_CONTROL = "agents"


def _signed(post: Any) -> bool:
    """A post of :meth:`EvidenceWriter.read_disputed`'s shape (signatures and values by key)."""
    return isinstance(post, dict) and isinstance(post.get("agree"), dict) and isinstance(post.get("values"), dict)


class EvidenceWriter:
    """Actor body: writes batches into ``<home>/runs/<run_id>/evidence.sqlite``."""

    def __init__(self, home: str, run_id: str) -> None:
        self.home = Path(home)
        self.run_id = run_id
        self.store: EvidenceStore = open_run(self.home, run_id)
        self.store.set_meta("run_id", run_id)
        self.started = time.time()
        self.registry: dict[str, dict[str, Any]] = {}
        self.controls: dict[str, Any] = {}
        self.mailboxes: dict[str, dict[str, Any]] = {}
        self._disputed: dict[str, tuple[Any, dict[str, Any]]] = {}
        """topic -> ((posts so far, the members read), :meth:`read_disputed`'s answer)."""
        self._posts: collections.Counter[str] = collections.Counter()
        """Posts taken per topic (a repost changes the answer)."""
        self._lock = threading.Lock()
        #: RPCs taken, by method (``info()["calls"]``): what the ingest bench reads per second and per rank.
        self.calls: collections.Counter[str] = collections.Counter()
        self.received = 0
        self.ingested = 0
        self.forwarded = 0
        self.node_id = _own_node_id()
        self.job_id = _own_job_id()
        self.agent_users: set[str] = set()
        """Jobs that asked for the node agents (:meth:`note_agent_user`)."""
        self._lifetime: Any = None
        """The agents' :class:`~raysleuth.agents.lifetime.Lifetime` (made at the first round)."""
        self.agents_retired = 0
        self.ingest_spool()
        threading.Thread(target=self._scan_spool, name="raysleuth-spool", daemon=True).start()

    def ingest_spool(self) -> int:
        """Store the run's abandoned spool files now; returns rows newly stored."""
        try:
            stored = spool.ingest_spools(self.home, self.store, self.run_id, nodes=[None, self.node_id])
        except Exception:
            return 0
        self.ingested += stored
        return stored

    def _scan_spool(self) -> None:
        asked = 0.0
        while True:
            time.sleep(SPOOL_SCAN_S)
            self.ingest_spool()
            if time.monotonic() - asked >= AGENT_FORWARD_S:
                asked = time.monotonic()
                try:
                    self._agents_round()
                except Exception:
                    pass  # the next round asks again: this thread also ingests the spools, and must not end

    def _agents_round(self) -> None:
        """Ask every node's agent to forward its spool, making the missing ones while they are wanted; retire
        them once no job that used raysleuth has been alive for a while (:mod:`raysleuth.agents.lifetime`)."""
        # lazy: only the writer actor decides the agents' lifetime; workers importing this module need none of it
        from raysleuth.agents import lifetime

        with self._lock:  # not get_controls(): that counts the RPCs workers make
            removed = self.controls.get(AGENTS_CONTROL) == "removed"
            jobs = {str(entry["job_id"]) for entry in self.registry.values() if entry.get("job_id")}
            jobs |= self.agent_users
            last = max((entry.get("last_seen", 0.0) for entry in self.registry.values()), default=None)
        if self.job_id:
            jobs.add(self.job_id)  # the job that made the writer
        if removed:  # after remove_agents() only the agents that commands made again are asked; none is made
            _ask_agents_to_forward(create=False)
            return
        try:
            alive: set[str] | None = ray_private.live_jobs()
        except Exception:
            alive = None  # cannot tell: keep them
        if self._lifetime is None:
            self._lifetime = lifetime.Lifetime()
        action = self._lifetime.step(lifetime.wanted(jobs, alive, last, time.time()), time.monotonic())
        if action == "retire":
            self.agents_retired += len(_retire_agents())
        else:
            _ask_agents_to_forward(create=action == "keep")

    def note_agent_user(self, job_id: str) -> None:
        """A job asked for the node agents (a ``raysleuth`` command): they stay while it is alive."""
        with self._lock:
            self.agent_users.add(str(job_id))

    def ingest(self, header: dict[str, Any], rows: list) -> int:
        """Store a batch an agent read from a dead worker's spool (not a live client: no registry entry)."""
        with self._lock:
            self.calls["ingest"] += 1
        stored = self.store.write_batch(header, rows)
        self.forwarded += stored
        return stored

    def write(self, header: dict[str, Any], rows: list) -> int:
        """Insert one batch; returns rows newly inserted (duplicates ignored)."""
        self._register([(header, rows)], "write")
        return self.store.write_batch(header, rows)

    def write_many(self, batches: list) -> list[int | None]:
        """Insert several clients' batches (``(header, rows)`` each, a node agent's relay) in one transaction;
        rows newly inserted, per batch. If that transaction fails, each batch is written alone: one bad
        batch (None in the answer) does not fail its node's others."""
        self._register(batches, "write_many")
        try:
            return list(self.store.write_batches([(header, rows) for header, rows in batches]))
        except Exception:
            stored: list[int | None] = []
            for header, rows in batches:
                try:
                    stored.append(self.store.write_batch(header, rows))
                except Exception:
                    stored.append(None)
            return stored

    def _register(self, batches: list, method: str) -> None:
        with self._lock:
            self.calls[method] += 1
            for header, rows in batches:
                client = header.get("client_id")
                if client:
                    entry = self.registry.setdefault(client, dict(header))
                    entry.update(header)
                    entry["last_seen"] = time.time()
                    if rows:
                        entry["rank"] = rows[-1][2]
                self.received += len(rows)

    def info(self) -> dict[str, Any]:
        """Where the evidence goes, and how much arrived."""
        return {
            "run_id": self.run_id,
            "path": str(self.store.path),
            "pid": os.getpid(),
            "started": self.started,
            "received": self.received,
            "ingested": self.ingested,
            "forwarded": self.forwarded,
            "agents_retired": self.agents_retired,
            "clients": len(self.registry),
            "calls": dict(self.calls),
        }

    def clients(self) -> list[dict[str, Any]]:
        """Every client that has sent evidence, with its last rank and time."""
        with self._lock:
            return [dict(entry) for entry in self.registry.values()]

    # controls ---------------------------------------------------------------

    def set_control(self, key: str, value: Any) -> dict[str, Any]:
        """Set (or, with ``None``, remove) a control value; returns all controls."""
        with self._lock:
            if value is None:
                self.controls.pop(key, None)
            else:
                self.controls[key] = value
            self.controls["_version"] = self.controls.get("_version", 0) + 1
            return dict(self.controls)

    def get_controls(self) -> dict[str, Any]:
        """All control values (workers poll this every few seconds)."""
        with self._lock:
            self.calls["get_controls"] += 1
            return dict(self.controls)

    # mailboxes --------------------------------------------------------------

    def post(self, topic: str, member: str, value: Any) -> int:
        """Leave ``value`` under ``topic`` for ``member``; returns how many members posted."""
        with self._lock:
            self.calls["post"] += 1
            box = self.mailboxes.setdefault(topic, {})
            box[member] = value
            self._posts[topic] += 1
            return len(box)

    def read(self, topic: str) -> dict[str, Any]:
        """Everything posted under ``topic`` so far."""
        with self._lock:
            self.calls["read"] += 1
            return dict(self.mailboxes.get(topic, {}))

    def read_disputed(self, topic: str, members: list[str]) -> dict[str, Any]:
        """``members``' posts under ``topic``, less what they all agree on (O(keys) a reader, not O(members x keys)).

        A post ``{"agree": {key: signature}, "values": {key: value}}`` keeps only the values of the keys
        whose signature is not the same in every such post among ``members``; ``agreed`` lists the others,
        ``members`` who posted, and ``posts`` only the posts left with anything. Any other post comes whole.
        Worked out once per topic and set of posts, whoever reads first.
        """
        with self._lock:
            self.calls["read"] += 1
            box = self.mailboxes.get(topic, {})
            posts = {member: box[member] for member in members if member in box}
            key = (self._posts[topic], tuple(sorted(posts)))
            cached = self._disputed.get(topic)
            if cached is not None and cached[0] == key:
                return cached[1]
            signed = [post["agree"] for post in posts.values() if _signed(post)]
            agreed = {name for name, signature in signed[0].items()
                      if all(other.get(name) == signature for other in signed[1:])} if signed else set()
            kept = {member: {name: value for name, value in post["values"].items() if name not in agreed}
                    if _signed(post) else post for member, post in posts.items()}
            result = {"agreed": sorted(agreed), "members": sorted(posts),
                      "posts": {member: value for member, value in kept.items() if value}}
            self._disputed[topic] = (key, result)
            return result

    def count(self, topic: str) -> int:
        """How many members posted under ``topic`` (what a waiting rank polls: an int, not the posts)."""
        with self._lock:
            self.calls["count"] += 1
            return len(self.mailboxes.get(topic, {}))

    def leave(self, done_topic: str, member: str, joined_topic: str, arrived: int, topics: list[str]) -> bool:
        """``member`` is done with a meeting; once every member that joined (posted to ``joined_topic``, or
        ``arrived`` if more) has left, ``topics`` and ``done_topic`` are dropped. True when they were."""
        with self._lock:
            self.calls["leave"] += 1
            done = self.mailboxes.setdefault(done_topic, {})
            done[member] = True
            if len(done) < max(arrived, len(self.mailboxes.get(joined_topic, {}))):
                return False
            for topic in [*topics, done_topic]:
                self.mailboxes.pop(topic, None)
                self._disputed.pop(topic, None)
                self._posts.pop(topic, None)
            return True

    def drop(self, topic: str) -> None:
        """Forget a topic."""
        with self._lock:
            self.calls["drop"] += 1
            self.mailboxes.pop(topic, None)
            self._disputed.pop(topic, None)
            self._posts.pop(topic, None)


def _own_node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


def _own_job_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_job_id()
    except Exception:
        return None


def _ask_agents_to_forward(create: bool = True) -> None:
    """Every node's agent (``create``: made where missing) sends its node's abandoned spool files to this writer.

    No wait for the answers.
    """
    try:
        import ray

        # lazy: only the writer actor asks agents to forward; the workers importing this module for get_writer need none
        from raysleuth import agents

        me = ray.get_runtime_context().current_actor
        handles = [handle for handle, _ip in agents.get_agents(timeout=10).values()] if create else \
            agents.existing_agents()
        for handle in handles:
            handle.forward_spools.remote(me)
    except Exception:
        pass  # no State API yet, a node going away: the next round asks again


def _retire_agents() -> list[str]:
    """Every agent forwards its node's spool one last time (waited for, up to 30 s), then goes; their names."""
    try:
        import ray

        from raysleuth import agents  # lazy: only the writer actor retires agents (as _ask_agents_to_forward)

        me = ray.get_runtime_context().current_actor
        refs = [handle.forward_spools.remote(me) for handle in agents.existing_agents()]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=30)
        return agents.kill_agents()
    except Exception:
        return []  # the next round, if they are still unwanted, does not try again: a command may remove them


_writer_lock = threading.Lock()


def get_writer(*, create: bool = True, home: Path | str | None = None):
    """The run's writer actor handle, created on the head node when missing.

    Needs a connected Ray. The run id is the Ray session name, so one Ray
    session is one run.
    """
    import ray

    # lazy: cluster's State API readers load only when a writer is looked up
    from raysleuth import cluster

    if not ray.is_initialized():
        raise ClusterUnreachable("not connected to Ray", fix="call ray.init() or raysleuth.cluster.connect() first")
    try:
        return ray.get_actor(WRITER_NAME, namespace=NAMESPACE)
    except ValueError:
        if not create:
            raise
    with _writer_lock:
        actor_class = ray.remote(EvidenceWriter)
        return actor_class.options(
            name=WRITER_NAME,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            max_task_retries=0,
            max_concurrency=8,
            num_cpus=0,
            enable_task_events=own.OWN_TASK_EVENTS,
            resources={ray_private.HEAD_NODE_RESOURCE: 0.001},
        ).remote(str(home or runtime.settings().home), cluster.session_name())
