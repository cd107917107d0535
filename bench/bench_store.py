"""Evidence store ingestion: records/s end to end vs a bare SQLite insert loop.

End to end = ``record()`` calls in Ray actors -> batching client -> writer
actor -> SQLite (WAL) on disk, timed until every record is acknowledged.
Baseline = one process inserting the same rows into an SQLite file with a
plain ``INSERT`` loop and one commit (no Ray, no batching, no JSON), in the
same run. Target: >= 20,000 records/s end to end.

Usage: python bench/bench_store.py [--records 200000] [--actors 4]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time

from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)


def bare_sqlite(count: int, path: str) -> float:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE records (id INTEGER PRIMARY KEY, kind TEXT, time REAL, rank INTEGER, data TEXT)")
    started = time.perf_counter()
    for n in range(count):
        db.execute("INSERT INTO records (kind, time, rank, data) VALUES (?, ?, ?, ?)",
                   ("log", time.time(), 0, json.dumps({"n": n, "loss": 0.5})))
    db.commit()
    seconds = time.perf_counter() - started
    db.close()
    return count / seconds


def end_to_end(count: int, actors: int, home: str) -> tuple[float, dict]:
    os.environ["RAYSLEUTH_HOME"] = home
    import ray

    from raysleuth import cluster, runtime
    from raysleuth.recorder import get_writer

    runtime.reload_settings()
    cluster.start_local(num_cpus=max(4, actors), log_to_driver=False)
    ray.get(get_writer().info.remote())  # the writer exists before timing starts

    @ray.remote(num_cpus=0)
    class Producer:
        def warm(self):
            from raysleuth.recorder import get_client

            get_client()
            return True

        def produce(self, count: int, rank: int) -> dict:
            from raysleuth import runtime
            from raysleuth.recorder import get_client, record

            runtime.set_rank(rank)
            for n in range(count):
                record("log", {"n": n, "loss": 0.5}, name="bench")
            ok = get_client().flush(timeout=120)
            stats = get_client().stats
            return {"ok": ok, "delivered": stats.delivered, "dropped": stats.dropped}

    producers = [Producer.remote() for _ in range(actors)]
    ray.get([p.warm.remote() for p in producers])
    per_actor = count // actors
    started = time.perf_counter()
    results = ray.get([p.produce.remote(per_actor, rank) for rank, p in enumerate(producers)])
    seconds = time.perf_counter() - started
    info = ray.get(get_writer().info.remote())
    assert all(r["ok"] for r in results), results
    ray.shutdown()
    return per_actor * actors / seconds, {"results": results, "writer_received": info["received"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--actors", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bare = bare_sqlite(args.records, os.path.join(tmp, "bare.sqlite"))
        e2e, detail = end_to_end(args.records, args.actors, tmp)
    print(f"bare SQLite insert loop      : {bare:12,.0f} records/s")
    print(f"end to end ({args.actors} actors -> writer): {e2e:12,.0f} records/s "
          f"(writer received {detail['writer_received']:,}, dropped {sum(r['dropped'] for r in detail['results'])})")
    print(f"ratio end-to-end / bare      : {e2e / bare:12.2f}x")
    target("end-to-end delivery", e2e >= 20_000, f"{e2e:,.0f} records/s (>= 20,000)")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
