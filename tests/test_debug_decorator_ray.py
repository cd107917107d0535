"""``@rs.debug_decorator`` on actor methods in real Ray workers: every call's span and log line arrive.

Regressions from issue 17: the worker's calls were not shipped (only the
driver's), and after ``rs.install_log_shipping()`` plus any library warning
the decorator's spans vanished. Secrets in the arguments stay redacted.
"""

from __future__ import annotations

import time

import ray

from raysleuth.recorder import get_client, open_store


def _rows(home, kind, pid, name_part, want, timeout=60.0):
    deadline = time.time() + timeout
    rows = []
    while time.time() < deadline:
        get_client().flush(10)
        store = open_store(home=home)
        try:
            rows = [r for r in store.query(kind) if r.pid == pid and name_part in (r.name or "")]
        finally:
            store.close()
        if len(rows) >= want:
            break
        time.sleep(0.5)
    return rows


def test_worker_calls_ship_spans_and_logs_even_after_log_shipping(ray_cluster):
    from victims.decorated_actor import DecoratedWorker

    worker = DecoratedWorker.remote()
    try:
        pid = ray.get(worker.pid.remote(), timeout=120)
        secret = {"scale": 2, "api_key": "sk-" + "workerSecretValue123456"}
        assert ray.get(worker.train_step.remote([1, 2, 3], secret), timeout=60) == 12
        ray.get(worker.ship_logs_and_warn.remote(), timeout=60)
        assert ray.get(worker.train_step.remote([4], {"scale": 1}), timeout=60) == 4
        assert ray.get(worker.flush.remote(), timeout=60)
        spans = _rows(ray_cluster.home, "span", pid, "train_step", 2)
        assert len(spans) == 2, [(r.name, r.data) for r in spans]
        assert "workerSecretValue" not in repr([r.data for r in spans])
        assert "<redacted>" in repr(spans[0].data["attrs"]["args"])
        logs = _rows(ray_cluster.home, "log", pid, "raysleuth.debug", 2)
        assert len(logs) == 2, [(r.name, r.data.get("message")) for r in logs]
        assert all("train_step" in r.data["message"] for r in logs)
    finally:
        ray.kill(worker)
