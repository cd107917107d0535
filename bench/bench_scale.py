"""Every reading command on a 1,000-rank hour: seconds and peak memory, as users call them.

Builds a synthetic run (``bench/_synthetic.py``: 1,000 ranks on 125 nodes
for 60 minutes, light mode by default, ``--mode full`` for the dense one)
through the real store API, as a live writer receives it (every rank's rows
10 s at a time), closes it as a writer does (its last pass), then runs each command the way a user does
(``python -m raysleuth ...`` in a fresh process, against that run) and
measures its wall time and its peak resident memory (``wait4``).

Targets: each command < 2 s and < 1 GB peak memory; the store's size per
1,000-rank hour <= 0.3 GB (light) / 1.5 GB (full); one pass sealing memory
samples and the top-level spans of its ids into blocks (``recorder.blocks``, ``recorder.span_blocks``), the
fourth of a run, the median of three, costs <= 10% of
writing the rows of the ranks whose samples it seals (both timed here, the write path's
``write_batch`` the baseline). A command's seconds are
its CPU seconds (user + system, from ``wait4``): every reader is one thread,
so on an idle machine they are its wall time, and they stay honest on a
loaded one (wall time is printed beside them). The baseline printed beside
each figure is the same run's bare CLI start-up (``raysleuth --help``),
which every command pays.

Usage: python bench/bench_scale.py [--ranks 1000] [--minutes 60] [--mode light|full]
                                   [--store PATH] [--keep] [--repeat 1]
"""

from __future__ import annotations

import argparse
import compileall
import concurrent.futures
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _synthetic import START, WINDOW, build_store, identity, rank_rows  # noqa: E402  (bench/ is on sys.path when run as a script)
from _targets import exit_code, target  # noqa: E402

SRC = Path(__file__).resolve().parent.parent / "src"
COMMANDS = (
    "logs --rank 7", "logs --level ERROR", "timeline --summary", "timeline -o {out}/trace.json", "memory",
    "memory --rank 7", "collectives --run {run}", "consistency", "crashes", "report -o {out}/report.html",
)
SECONDS, MEMORY_GB = 2.0, 1.0
SIZE_GB = {"light": 0.3, "full": 1.5}


def run_command(args: list[str], env: dict[str, str]) -> tuple[float, float, int, str, float]:
    """(seconds, peak GB, exit code, last output line, CPU seconds) of one CLI call in its own process."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "raysleuth", *args], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in output.decode(errors="replace").splitlines() if line.strip()]
    return (seconds, usage.ru_maxrss / 2**20, process.returncode, (lines[-1][:110] if lines else ""),
            usage.ru_utime + usage.ru_stime)


def seal_cost(mode: str, before: int = 3) -> tuple[float, float, int]:
    """(CPU s of one pass over ~32,768 memory samples, CPU s of writing the rows it covers through the store's
    write path: the baseline, in this run, sealed samples). The rows come as a live writer receives them: every one
    of 1,000 ranks' rows of each ``WINDOW`` seconds in turn, so the pass holds a few dozen samples of every rank.
    The timed pass comes after ``before`` passes, as late in a run: its cost must not grow with what they hold."""
    from bisect import bisect_left

    from raysleuth.recorder import blocks
    from raysleuth.recorder.store import EvidenceStore

    ranks = 1000
    every = [sorted((row + (n,) for n, row in enumerate(
        rank_rows(rank, world=ranks, minutes=1 + (before + 1) * blocks.PASS_ROWS / ranks / (1 if mode == "full" else 0.1)
                  / 60, mode=mode, culprit=7, leaker=13, straggler=5, seed=0))), key=lambda row: row[1])
             for rank in range(ranks)]
    times = [[row[1] for row in rows] for rows in every]
    folder = Path(tempfile.mkdtemp(prefix="raysleuth-seal-"))
    store, rows_per_pass = EvidenceStore(folder / "evidence.sqlite"), blocks.PASS_ROWS
    blocks.PASS_ROWS = 10**12  # each pass is made here, the last one timed alone
    try:
        at, edge = [0] * ranks, START + WINDOW
        for number in range(before + 1):
            started, samples = time.process_time(), 0
            while samples < rows_per_pass:
                for rank in range(ranks):
                    end = bisect_left(times[rank], edge, lo=at[rank])
                    if end > at[rank]:
                        rows = every[rank][at[rank]:end]
                        store.write_batch(identity(rank, ranks), rows)
                        samples += sum(row[0] == "memory" for row in rows)
                        at[rank] = end
                edge += WINDOW
            # the rows' own checkpoint (SQLite's, when its log passes 1,000 pages) is theirs: done before the pass
            # it could otherwise fall on (one pass in three paid it: 0.19 s against 0.12)
            store._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            written = time.process_time() - started
            started = time.process_time()
            sealed = blocks.seal(store._db)
        return time.process_time() - started, written, sealed
    finally:
        blocks.PASS_ROWS = rows_per_pass
        store.close()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--mode", choices=("light", "full"), default="light")
    parser.add_argument("--store", help="reuse (or build once into) this folder")
    parser.add_argument("--keep", action="store_true", help="keep the built store")
    parser.add_argument("--repeat", type=int, default=1, help="runs per command (the median is shown)")
    options = parser.parse_args()
    home = Path(options.store or tempfile.mkdtemp(prefix="raysleuth-scale-"))
    run_id = f"synthetic-{options.mode}-{options.ranks}x{options.minutes:g}"
    db = home / "runs" / run_id / "evidence.sqlite"
    if not db.exists():
        db.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        # in a process of its own: every rank's rows (4 GB in full mode) would stay in this one, and a command's
        # peak memory (wait4's ru_maxrss) starts from its parent's at the fork
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            counts = pool.submit(build_store, db, ranks=options.ranks, minutes=options.minutes,
                                 mode=options.mode).result()
        built = time.perf_counter() - started
        rows = sum(counts.values())
        print(f"built {rows:,} rows ({', '.join(f'{k} {v:,}' for k, v in sorted(counts.items()))}) in {built:.1f}s "
              f"({rows / built:,.0f} rows/s)", flush=True)
    (home / "runs" / "latest").write_text(run_id)
    out = Path(tempfile.mkdtemp(prefix="raysleuth-scale-out-"))
    env = {**os.environ, "RAYSLEUTH_HOME": str(home), "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "RAY_ADDRESS": "127.0.0.1:1", "COLUMNS": "200"}  # a stored run: no cluster answers (nothing listens)
    # as an installed raysleuth holds its bytecode (pip compiles it at install): where PYTHONDONTWRITEBYTECODE is
    # set, every call would otherwise compile raysleuth's own modules again (0.1 CPU s a call)
    compileall.compile_dir(str(SRC / "raysleuth"), quiet=1)
    base = run_command(["--help"], env)[4]
    size_gb = sum(f.stat().st_size for f in db.parent.iterdir()) / 1e9
    hour = 60.0 / options.minutes * 1000.0 / options.ranks
    print(f"store {db}: {size_gb:.3f} GB; CLI start-up (raysleuth --help) {base:.2f} CPU s; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n", flush=True)
    print("| command | CPU s | wall s | peak GB | exit | last line |\n|---|---|---|---|---|---|")
    figures = []
    for command in COMMANDS:
        args = command.format(out=out, run=run_id).split()
        runs = [run_command(args, env) for _ in range(max(1, options.repeat))]
        seconds = statistics.median(r[4] for r in runs)
        wall = statistics.median(r[0] for r in runs)
        peak = max(r[1] for r in runs)
        figures.append((command.split(" {")[0].replace("{run}", "RUN"), seconds, peak, runs[-1][2]))
        print(f"| `{command.format(out='OUT', run='RUN')}` | {seconds:.2f} | {wall:.2f} | {peak:.2f} | {runs[-1][2]} | "
              f"{runs[-1][3].replace('|', '/')} |", flush=True)
    print()
    for name, seconds, peak, code in figures:
        target(f"{name} < {SECONDS:g} s", seconds < SECONDS, f"{seconds:.2f}s ({seconds / base:.1f}x start-up)")
        target(f"{name} < {MEMORY_GB:g} GB", peak < MEMORY_GB, f"{peak:.2f} GB peak")
        target(f"{name} answers", code in (0, 1), f"exit {code}")
    target(f"{options.mode} store <= {SIZE_GB[options.mode]} GB per 1,000-rank hour",
           size_gb * hour <= SIZE_GB[options.mode], f"{size_gb * hour:.2f} GB")
    # one pass is a tenth of a second: the median of three runs, each pass beside its own baseline
    costs = sorted((seal_cost(options.mode) for _ in range(3)), key=lambda cost: cost[0] / cost[1])
    pass_s, write_s, sealed = costs[1]
    target("a pass (memory blocks and span blocks), the fourth of a run, <= 10% of writing its rows, median of 3",
           pass_s <= 0.1 * write_s, f"{pass_s:.3f} CPU s for {sealed:,} samples against {write_s:.2f} s writing their "
           f"ranks' rows ({pass_s / write_s:.1%}; the three: "
           f"{', '.join(f'{cost[0] / cost[1]:.1%}' for cost in costs)})")
    if not options.keep and not options.store:
        shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
