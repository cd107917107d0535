"""Benchmark: rank-aware log shipping and the monitoring modes' overhead.

1. Cost per shipped log record (``rs.get_logger(...).info(...)``: RankFilter,
   record data, a deque append; a background thread delivers to a real
   SQLite store) vs a stdlib logger writing to a ``NullHandler``, same run.
2. A tight training-like loop (a numpy matmul step, with a heartbeat, a span
   and a log call per step) with instruments off, in light mode and in full
   mode: the overhead of each mode over off.

Times are this process's CPU time (``time.process_time``, the delivery
thread included), so other load on the machine does not blur them.
No Ray: the batching client delivers straight into a local store (the
writer actor's cost is off the training process's path in both cases).
Run: ``.venv/bin/python bench/bench_logs.py`` (about 30 s).
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
os.environ["RAYSLEUTH_HOME"] = tempfile.mkdtemp(prefix="bench_logs_")
os.environ.pop("RAYSLEUTH_MODE", None)
os.environ.pop("RAYSLEUTH_LOG_LEVEL", None)
for _threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")  # one BLAS thread: a steady step time to compare against

import numpy as np  # noqa: E402

import raysleuth as rs  # noqa: E402
from raysleuth import monitoring, runtime  # noqa: E402
from raysleuth.recorder import RecordClient, StoreSink, get_client, reset_client  # noqa: E402
from raysleuth.recorder.store import EvidenceStore  # noqa: E402
from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)

try:
    from raysleuth.progress import heartbeat
except ImportError:  # the heartbeat feature is not installed: record one by hand
    def heartbeat(step=None):
        rs.record("heartbeat", {"step": step}, step=step)

try:
    from raysleuth.tracing import span
except ImportError:
    import contextlib

    span = lambda name, step=None: contextlib.nullcontext()  # noqa: E731

RECORDS = 5_000
STEPS = 2_000
ROUNDS = 3


def per_call(function, count: int) -> float:
    start = time.process_time()
    for i in range(count):
        function(i)
    return (time.process_time() - start) / count


def bench_shipping(store: EvidenceStore) -> tuple[float, float]:
    runtime.set_rank(3, 8)
    shipped = rs.get_logger("bench.shipped", console=False)
    shipped.propagate = False
    plain = logging.getLogger("bench.plain")
    plain.propagate = False
    plain.addHandler(logging.NullHandler())
    plain.setLevel(logging.INFO)
    ship_times, null_times = [], []
    for _ in range(ROUNDS):
        null_times.append(per_call(lambda i: plain.info("step %d loss=%.4f", i, 0.5), RECORDS))
        ship_times.append(per_call(lambda i: shipped.info("step %d loss=%.4f", i, 0.5), RECORDS))
        get_client().flush(timeout=60)
    return statistics.median(ship_times), statistics.median(null_times)


THREAD_TIMES: dict[str, list[float]] = {}
MODE = ["warm-up"]


def training_loop(steps: int, logger: logging.Logger) -> float:
    """CPU per step: the whole process (instruments + background delivery into SQLite here);
    the training thread's own share goes to THREAD_TIMES."""
    a = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
    b = a.copy()
    start, start_thread = time.process_time(), time.thread_time()
    for step in range(steps):
        heartbeat(step)
        with span("train_step", step=step):
            b = a @ b
            b /= np.abs(b).max() + 1.0
        logger.info("step %d loss=%.4f", step, float(b[0, 0]))
    get_client().flush(timeout=60)  # delivery is part of the process's cost
    THREAD_TIMES.setdefault(MODE[0], []).append((time.thread_time() - start_thread) / steps)
    return (time.process_time() - start) / steps


def bench_modes() -> dict[str, float]:
    logger = rs.get_logger("bench.loop", console=False)
    logger.propagate = False
    times: dict[str, list[float]] = {"off": [], "light": [], "full": []}
    switch = {"off": monitoring.disable_monitoring, "light": monitoring.enable_lightweight_monitoring,
              "full": monitoring.enable_full_debugging}
    training_loop(200, logger)  # warm up numpy and the instruments
    for _ in range(ROUNDS):
        for mode in ("off", "light", "full"):
            switch[mode]()
            MODE[0] = mode
            times[mode].append(training_loop(STEPS, logger))
    monitoring.enable_lightweight_monitoring()
    return {mode: statistics.median(values) for mode, values in times.items()}


def main() -> int:
    store = EvidenceStore(Path(os.environ["RAYSLEUTH_HOME"]) / "bench.sqlite")
    reset_client(RecordClient(StoreSink(store)))
    ship, null = bench_shipping(store)
    shipped = store.count("log")
    print(f"shipped log record: {ship * 1e6:.2f} us CPU/record vs stdlib+NullHandler {null * 1e6:.2f} us/record "
          f"(x{ship / null:.1f}; {shipped} records stored)")
    modes = bench_modes()
    off = modes["off"]
    for mode in ("light", "full"):
        print(f"training loop, {mode:5s}: {modes[mode] * 1e6:8.1f} us CPU/step vs off {off * 1e6:8.1f} us/step "
              f"(+{(modes[mode] - off) * 1e6:.1f} us/step, {100 * (modes[mode] / off - 1):+.1f}%) "
              "[process CPU, including delivery into a local SQLite store]")
    thread = {mode: statistics.median(values) for mode, values in THREAD_TIMES.items() if mode in modes}
    for mode in ("light", "full"):
        print(f"  training thread only, {mode:5s}: {thread[mode] * 1e6:8.1f} us/step vs off {thread['off'] * 1e6:8.1f} "
              f"(+{(thread[mode] - thread['off']) * 1e6:.1f} us/step, {100 * (thread[mode] / thread['off'] - 1):+.1f}%)")
    print(f"store: {store.kinds()}")
    runtime.reload_settings()
    target("shipped log record", ship / null <= 6.0 and shipped >= RECORDS * ROUNDS,
           f"x{ship / null:.1f} a stdlib NullHandler record (<= 6x), {shipped} of {RECORDS * ROUNDS} stored")
    target("light mode, training thread", thread["light"] - thread["off"] <= 20e-6,
           f"+{(thread['light'] - thread['off']) * 1e6:.1f} us/step (<= 20 us)")
    return exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
