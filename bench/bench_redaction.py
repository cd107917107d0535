"""Cost of redacting every record (``redacted_row``, on the client's background thread) vs serialising it.

    .venv/bin/python bench/bench_redaction.py

The recorder passes every row of every kind through the one redactor when it
leaves the worker's buffer, then serialises it (``json.dumps``, in the writer
or the spool). Both happen off the caller's thread; the caller of ``rs.span``
pays only the deque append (``bench/bench_spans.py``). This bench measures,
in one run, redaction against the ``json.dumps`` the row gets anyway, for a
span row (numbers and small attributes: the many), an event row, and a death
record (log tail, Ray message, memory-monitor command lines: the rare and
large). Targets, as ratios to the same run's ``json.dumps`` (a shared
machine's load moves both alike): a span row at most 2x, an event row at most
15x, a death record (200 log lines, each searched for secrets) at most 150x.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from raysleuth.recorder.store import redacted_row  # noqa: E402
from raysleuth.tracing import _span_data  # noqa: E402
from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)

N = 20_000


def per_row_us(function, rows, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for row in rows:
            function(row)
        best = min(best, time.perf_counter() - started)
    return best / len(rows) * 1e6


def _dumps(row) -> str:
    return json.dumps(list(row), default=repr, separators=(",", ":"))


def main() -> int:
    spans = [("span", 1.0, 0, 3, "forward", "forward", None,
              _span_data((1.0, 2.0, i, None, {"batch": 32, "layer": f"attn.{i % 24}"}, 1234, None)), i)
             for i in range(N)]
    events = [("event", 1.0, 0, 3, None, "checkpoint", None,
               {"path": f"/data/ckpt/step-{i}/model.safetensors", "step": i, "message": "saved in 3.2s"}, i)
              for i in range(N)]
    tail = [f"[rank 0] step {i} loss=0.{i:04d} lr=3e-4 grad_norm=1.2 tokens/s=9100" for i in range(200)]
    deaths = [("death", 1.0, 0, 3, None, "Trainer", "ERROR",
               {"cause": "memory_monitor", "summary": "killed by Ray's memory monitor",
                "evidence": ["Ray: Task was killed due to the node running low on memory."],
                "log_tail": {"err": tail}, "top_memory_users": [
                    {"pid": 4242 + k, "memory_gb": 4.1, "command": "ray::Trainer.train --lr 3e-4 --epochs 3"}
                    for k in range(5)]}, i) for i in range(200)]
    print(f"redaction per row vs json.dumps of the same row, best of 3 ({N:,} spans/events, 200 deaths)")
    results = []
    for label, rows in (("span", spans), ("event", events), ("death", deaths)):
        redact_us, dumps_us = per_row_us(redacted_row, rows), per_row_us(_dumps, rows)
        print(f"  {label:6s} redacted_row {redact_us:8.2f} µs   json.dumps {dumps_us:8.2f} µs   "
              f"{redact_us / dumps_us:5.2f}x")
        results.append((label, redact_us, dumps_us))
    for (label, redact_us, dumps_us), most in zip(results, (2, 15, 150)):
        target(f"{label} row redaction vs json.dumps", redact_us / dumps_us <= most,
               f"{redact_us / dumps_us:.2f}x (<= {most}x)")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
