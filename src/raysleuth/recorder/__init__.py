"""The evidence store: one SQLite file per run, one writer actor, batching clients.

- :mod:`raysleuth.recorder.store` — the database (schema, migrations, queries).
- :mod:`raysleuth.recorder.writer` — the writer actor's body.
- :mod:`raysleuth.recorder.client` — the worker-side batching client;
  :mod:`~raysleuth.recorder.sinks` where it delivers;
  :mod:`~raysleuth.recorder.process` this process's client and its exits;
  :mod:`~raysleuth.recorder.spool` what waits on disk.

Features call :func:`record` to add evidence and :func:`open_store` to read
it back (the CLI reads the file directly, with or without a cluster).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from raysleuth import runtime
from raysleuth.errors import StoreNotFound
from raysleuth.recorder import spool
from raysleuth.recorder.client import RecordClient
from raysleuth.recorder.process import get_client, record, reset_client
from raysleuth.recorder.sinks import StoreSink, WriterSink
from raysleuth.recorder.store import DB_NAME, EvidenceStore, Record, latest_run, list_runs, resolve_store_path, run_dir
from raysleuth.recorder.files import write_private

__all__ = [
    "EvidenceStore",
    "NAMESPACE",
    "Record",
    "RecordClient",
    "RunChoice",
    "StoreSink",
    "WRITER_NAME",
    "WriterSink",
    "choose_run",
    "deliver_spooled",
    "get_client",
    "get_writer",
    "latest_run",
    "list_runs",
    "flush",
    "open_store",
    "record",
    "reset_client",
    "resolve_store_path",
]

_WRITER_NAMES = frozenset({"NAMESPACE", "WRITER_NAME", "EvidenceWriter", "get_writer"})


def __getattr__(name: str):
    """The writer's names, imported on first use.

    A worker's control thread imports this package while Ray's main thread
    may be importing ``recorder.writer`` to build the writer actor; were the
    writer imported here, the two imports would wait on each other and one
    would fail (``KeyError: 'raysleuth.recorder'`` in the writer's process).
    """
    if name in _WRITER_NAMES:
        # lazy: importing the writer at the head deadlocks two threads' imports (see the docstring)
        from raysleuth.recorder import writer

        return getattr(writer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



@dataclass
class RunChoice:
    """Which run a reader shows, and why (every command names it)."""

    run_id: str
    path: Path
    reason: str
    """``given`` (--run), ``connected`` (the run of the cluster this process is connected to), ``newest``."""

    def to_dict(self) -> dict[str, str]:
        """JSON-ready."""
        return {"run_id": self.run_id, "path": str(self.path), "reason": self.reason}

    def describe(self) -> str:
        """One line for stderr."""
        why = {"given": "--run", "connected": "the connected cluster's run", "newest": "the newest run; --run picks another"}
        return f"run {self.run_id} ({why.get(self.reason, self.reason)}): {self.path}"


def choose_run(run: str | None = None, *, home: Path | str | None = None) -> RunChoice:
    """Resolve the run a reader should show; never falls back silently.

    Abandoned spool files are stored into their runs first, so a job that
    ended before its records reached the writer is read from its own run.
    A process connected to Ray reads its cluster's run; if that run has no
    evidence, it is an error that names the run, not the previous job's run.
    That holds in this process's own home, where its cluster writes; another
    ``home`` given explicitly is an archive, read at its newest run.
    """
    own_home = runtime.settings().home
    home_path = Path(home) if home else own_home
    deliver_spooled(home_path)
    if run is not None:
        path = resolve_store_path(home_path, run)
        return RunChoice(run_id=path.parent.name, path=path, reason="given")
    session = _connected_session() if _same_folder(home_path, own_home) else None
    if session is not None:
        path = run_dir(home_path, session) / DB_NAME
        if path.is_file():
            return RunChoice(run_id=session, path=path, reason="connected")
        newest = latest_run(home_path)
        raise StoreNotFound(
            f"the connected cluster's run {session} has no evidence under {home_path} yet",
            fix=(f"record something first, or pass --run {newest} to read the newest run" if newest
                 else "record something first (instruments write as soon as a worker uses them)"),
        )
    path = resolve_store_path(home_path, None)
    return RunChoice(run_id=path.parent.name, path=path, reason="newest")


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return Path(a) == Path(b)


def open_store(run: str | None = None, *, home: Path | str | None = None) -> EvidenceStore:
    """Open a run's evidence read-only.

    ``run``: a run id or a path to an ``evidence.sqlite``. Without one, a
    process connected to Ray reads the run of *its* cluster (the Ray session
    name), so several clusters sharing one home never mix; otherwise the
    latest run. See :func:`choose_run`.
    """
    return EvidenceStore(choose_run(run, home=home).path, readonly=True)


def deliver_spooled(home: Path | str | None = None, run: str | None = None) -> int:
    """Store abandoned spool files into their runs (creating a run that has none); returns rows stored.

    A run created this way becomes the latest when its evidence is newer
    than the latest run's. Never raises (a read-only home is read as it is).
    """
    home_path = Path(home) if home else runtime.settings().home
    stored = 0
    for run_id in ([run] if run else spool.pending_runs(home_path)):
        try:
            stored += _deliver_run_spool(home_path, run_id)
        except Exception:
            continue
    return stored


def _deliver_run_spool(home: Path, run_id: str) -> int:
    files = spool.abandoned(home, run_id)
    if not files:
        return 0  # only live clients' files: they deliver their own; never create a run for nothing
    path = run_dir(home, run_id) / DB_NAME
    existed = path.is_file()
    newest_spool = max((f.stat().st_mtime for f in files), default=0.0)
    store = EvidenceStore(path)
    try:
        stored = spool.ingest_spools(home, store, run_id)
    finally:
        store.close()
    if not existed and stored:
        latest = latest_run(home)
        latest_path = run_dir(home, latest) / DB_NAME if latest else None
        if latest is None or latest == run_id or latest_path is None or newest_spool > latest_path.stat().st_mtime:
            marker = home / "runs" / "latest"
            tmp = marker.with_name(f".latest.{os.getpid()}")
            write_private(tmp, run_id.encode())
            os.replace(tmp, marker)
    return stored


def _connected_session() -> str | None:
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        # lazy: every instrument imports the recorder; cluster's State API readers load only where Ray is up
        from raysleuth import cluster

        return cluster.session_name()
    except Exception:
        return None


def flush(timeout: float = 10.0) -> bool:
    """Deliver this process's queued evidence now (``rs.flush()``); False if some is still queued.

    Call it before a prompt exit you control; instruments deliver on their own
    every fraction of a second. Never raises.
    """
    try:
        return bool(get_client().flush(timeout))
    except Exception:
        return False
