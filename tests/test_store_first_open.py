"""Processes that open a new run's database at the same moment all get it (no first record lost).

Found under load in ``bench/bench_weights.py``: the two ranks of a job
without Ray both made the ``local`` run at once; the second failed on
``table meta already exists`` (or on ``database is locked`` while the first
turned the file to WAL), ``record()`` swallowed the error, and that rank's
first record (its first sync) was gone.
"""

from __future__ import annotations

import multiprocessing
import os

from raysleuth.recorder.store import SCHEMA_VERSION, EvidenceStore

OPENERS = 3
TRIALS = 12


def _open_each(paths, barrier, results) -> None:
    from raysleuth.recorder.store import EvidenceStore as Store

    failures = []
    for path in paths:
        barrier.wait(timeout=60)  # every opener starts on the same new file together
        try:
            store = Store(path)
            store.write_batch({"client_id": f"c{os.getpid()}"}, [("log", 1.0, 0, 0, None, "x", "INFO", {}, 1)])
            store.close()
        except Exception as error:  # the test reports it
            failures.append(f"{type(error).__name__}: {error}")
    results.put(failures)


def test_processes_opening_one_new_run_at_once_all_get_it(tmp_path):
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold Ray's threads
    paths = [str(tmp_path / f"run{trial}" / "evidence.sqlite") for trial in range(TRIALS)]
    for path in paths:
        os.makedirs(os.path.dirname(path), mode=0o700)
    barrier, results = context.Barrier(OPENERS), context.Queue()
    openers = [context.Process(target=_open_each, args=(paths, barrier, results)) for _ in range(OPENERS)]
    for opener in openers:
        opener.start()
    failures = [failure for _ in openers for failure in results.get(timeout=120)]
    for opener in openers:
        opener.join(timeout=30)
    assert not failures, failures[:3]
    for path in paths:
        store = EvidenceStore(path, readonly=True)
        assert store.schema_version == SCHEMA_VERSION and store.count("log") == OPENERS
        store.close()
