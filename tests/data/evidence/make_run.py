"""Write the evidence run that tests/test_evidence_same.py reads: real features, a real store, no Ray.

How it was made (once, on the code before the evidence package; commit f51b333):

    PYTHONPATH=src python tests/data/evidence/make_run.py tests/data/evidence/run.jsonl

Three rank processes (``RANK=0..2``) each run a short training loop with the real instruments
(``rs.step``, ``rs.span``, ``rs.get_logger``, ``rs.capture_crashes``, ``rs.event``, ``rs.memory.watch``,
``rs.MemoryProfiler``)
into the process's local run; the driver adds what needs a cluster or a judge elsewhere the way those
features write it (a consistency check's ``ConsistencyReport``, a classified ``Death``, a doctor report).
Every row of the run is then dumped as a JSON line (the columns as stored), so the test loads the
very rows into a fresh store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def rank_main(rank: int) -> None:
    import raysleuth as rs

    log = rs.get_logger("train")
    profiler = rs.MemoryProfiler()
    rs.memory.watch(interval=0.05)
    hog = []

    @rs.capture_crashes
    def update(step: int) -> None:
        scale = float("nan") if rank == 1 else 1.0
        raise ValueError(f"gradient scale became {scale} at step {step}")

    for step in range(8):
        with rs.step(step):
            with rs.span("forward_backward"):
                time.sleep(0.02)
            with rs.span("exchange"):
                time.sleep(0.02 + (0.08 if rank == 2 else 0.0))
        if rank == 1:
            hog.append(bytearray(4 * 2**20))
        if step in (0, 7):
            profiler.take_snapshot(f"step {step}")
        time.sleep(0.2)
        if step == 3:
            log.warning("loss spike %.2f", 3.5 + rank, step=step)
        log.info("step %d done", step, step=step)
    rs.event("checkpoint", path="/tmp/ckpt", step=7)
    if rank != 0:
        try:
            update(7)
        except ValueError:
            log.error("update failed on rank %d", rank, step=7)
    rs.memory.stop()
    rs.flush()


def driver(home: Path) -> None:
    from raysleuth.consistency.report import ConsistencyReport, Mismatch
    from raysleuth.deaths import Death
    from raysleuth.doctor import run_doctor
    from raysleuth.recorder.store import open_run

    store = open_run(home, "local", take_latest=False)
    for step in (0, 4):
        report = ConsistencyReport(key="params", consistent=step == 0, world_size=3, step=step, rank=0,
                                   tensors_checked=["head.weight", "body.weight"], arrived_ranks=[0, 1, 2])
        if step:
            report.mismatches = [Mismatch(name="head.weight", kind="value", groups=[[0, 2], [1]],
                                          outlier_ranks=[1], first_index=[0, 3], max_abs_diff=0.5)]
        store.add("consistency", report.to_dict(), name="params", step=step, rank=0,
                  level="INFO" if report.consistent else "ERROR", pid=5000)
    death = Death(cause="sigkill", summary="rank 2 was killed by SIGKILL (the kernel's OOM killer)",
                  evidence=["dmesg: Out of memory: Killed process 5002"], rank=2, rank_source="runtime_env",
                  world_size=3, actor_class="Trainer", pid=5002, node_ip="127.0.0.1", task="Trainer.update",
                  died_at=time.time(), signal=9, last_stderr=["step 7", "Killed"], fix="give the job more memory")
    store.add("death", death.to_dict(), name=death.cause, level="ERROR", rank=2, pid=5002, node_ip="127.0.0.1",
              actor_class="Trainer", time=death.died_at)
    store.add("doctor", run_doctor(ray=False, record=False).to_dict(), name="doctor")
    store.close()


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "RAYSLEUTH_HOME": home}
        for rank in range(3):
            subprocess.run([sys.executable, __file__, "--rank", str(rank)], env={**env, "RANK": str(rank),
                           "WORLD_SIZE": "3"}, check=True)
        driver(Path(home))
        import sqlite3

        db = sqlite3.connect(Path(home) / "runs" / "local" / "evidence.sqlite")
        db.row_factory = sqlite3.Row
        with out.open("w") as stream:
            from raysleuth.recorder.schema import COLUMNS  # the view's own columns (schema 4 adds readers' ones)

            for row in db.execute(f"SELECT id, {', '.join(COLUMNS)} FROM records ORDER BY id"):
                stream.write(json.dumps(dict(row), sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]))
    else:
        main(Path(sys.argv[1]))
