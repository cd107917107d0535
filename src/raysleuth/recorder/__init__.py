"""The evidence store: one SQLite file per run, one writer actor, batching clients.

- :mod:`raysleuth.recorder.store` — the database (schema, migrations, queries).
- :mod:`raysleuth.recorder.writer` — the writer actor's body.
- :mod:`raysleuth.recorder.client` — the worker-side batching client.

Features call :func:`record` to add evidence and :func:`open_store` to read
it back (the CLI reads the file directly, with or without a cluster).
"""

from __future__ import annotations

import threading
from pathlib import Path

from raysleuth import ray_private, runtime
from raysleuth.errors import ClusterUnreachable
from raysleuth.recorder.client import RecordClient, StoreSink, WriterSink, get_client, record, reset_client
from raysleuth.recorder.store import EvidenceStore, Record, latest_run, list_runs, resolve_store_path
from raysleuth.recorder.writer import NAMESPACE, WRITER_NAME, EvidenceWriter

__all__ = [
    "EvidenceStore",
    "NAMESPACE",
    "Record",
    "RecordClient",
    "StoreSink",
    "WRITER_NAME",
    "WriterSink",
    "get_client",
    "get_writer",
    "latest_run",
    "list_runs",
    "open_store",
    "record",
    "reset_client",
    "resolve_store_path",
]

_writer_lock = threading.Lock()


def get_writer(*, create: bool = True, home: Path | str | None = None):
    """The run's writer actor handle, created on the head node when missing.

    Needs a connected Ray. The run id is the Ray session name, so one Ray
    session is one run.
    """
    import ray

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
            resources={ray_private.HEAD_NODE_RESOURCE: 0.001},
        ).remote(str(home or runtime.settings().home), cluster.session_name())


def open_store(run: str | None = None, *, home: Path | str | None = None) -> EvidenceStore:
    """Open a run's evidence read-only.

    ``run``: a run id or a path to an ``evidence.sqlite``. Without one, a
    process connected to Ray reads the run of *its* cluster (the Ray session
    name), so several clusters sharing one home never mix; otherwise the
    latest run.
    """
    home_path = Path(home) if home else runtime.settings().home
    if run is None:
        run = _connected_run(home_path)
    return EvidenceStore(resolve_store_path(home_path, run), readonly=True)


def _connected_run(home: Path) -> str | None:
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        from raysleuth import cluster

        session = cluster.session_name()
    except Exception:
        return None
    return session if (home / "runs" / session / "evidence.sqlite").is_file() else None
