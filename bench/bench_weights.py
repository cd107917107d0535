"""The weight-sync check's cost: a trainer -> rollout sync of >= 256 MiB with and without it, in one run.

    .venv/bin/python bench/bench_weights.py                  # 256 MiB of bf16 weights, 16 rounds
    .venv/bin/python bench/bench_weights.py --size 1G --rounds 20

Two processes join a gloo group on 127.0.0.1 (the CPU stand-in for verl's
NCCL CheckpointEngine). Rank 0 sends a model's worth of bf16 tensors (8 MiB
matrices, each followed by an 8 KiB norm) with one broadcast each; rank 1
receives them. Each round runs three syncs, in an order that changes from
round to round: ``plain``, ``plain again`` and ``checked`` (the default call
users make: the stream goes through ``rs.weights_sent`` on rank 0 and
``rs.weights_received`` on rank 1, so every tensor is fingerprinted on both
sides and each side writes one record).

Two figures, each per round against that round's plain sync, with the
median and a distribution-free 95 % interval over the rounds:

- wall time: the checked sync over the plain one;
- CPU: what the check adds on both sides' callers' threads and raysleuth's
  digest thread, over the fastest plain sync: the most the check can add if
  none of it overlaps the transfer.

Each has an A/A control: ``plain again`` read the same way as ``checked``,
which is zero but for what this machine's noise makes of it. Target (CPU):
the checked sync takes < 5 % longer than the plain one, judged on the first
figure (wall time first) whose control's 95 % interval lies within +-2.5 %;
when neither does, the run cannot tell and says so (a MISS, exit 1). Then
``--healthy`` (default 200) more checked syncs of a small stream, and every
checked sync is read back from the store: each must be intact, with no
alarm. Also printed, not a target: the same check on a colocated sync that
is only an in-memory copy (verl's ``naive`` backend), where the check reads
every byte once, as the copy does. Exits 1 on a MISS.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)

MiB = 1024**2
TARGET_OVERHEAD = 0.05


def parse_size(text: str) -> int:
    units = {"K": 1024, "M": MiB, "G": 1024**3}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def model_weights(total_bytes: int):
    """bf16 tensors adding up to ``total_bytes``: 8 MiB matrices, each followed by a small vector (a norm)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    weights, used, index = [], 0, 0
    while used < total_bytes:
        rows = min(1024, max(1, (total_bytes - used) // (4096 * 2)))
        weights.append((f"layers.{index}.proj.weight", torch.randn(rows, 4096, generator=generator).bfloat16()))
        weights.append((f"layers.{index}.norm.weight", torch.ones(4096, dtype=torch.bfloat16)))
        used += rows * 4096 * 2 + 4096 * 2
        index += 1
    return weights


def _send(weights, checked: bool, version: int) -> None:
    import torch.distributed as dist

    import raysleuth as rs

    stream = rs.weights_sent(iter(weights), version=version) if checked else iter(weights)
    for _, tensor in stream:
        dist.broadcast(tensor, src=0)


def _receive(buffers, checked: bool, version: int) -> None:
    import torch.distributed as dist

    import raysleuth as rs

    def arrive():
        for name, buffer in buffers:
            dist.broadcast(buffer, src=0)
            yield name, buffer

    stream = rs.weights_received(arrive(), version=version) if checked else arrive()
    for _ in stream:
        pass


KINDS = ("plain", "plain again", "checked")
ORDERS = list(itertools.permutations(KINDS))  # every order in turn: no kind always runs first in its round


def _check_threads_cpu() -> float:
    """CPU seconds so far of this (the caller's) thread and of raysleuth's digest thread, where there is one."""
    total = time.thread_time()
    for thread in threading.enumerate():
        if thread.name.startswith("raysleuth-weights") and thread.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except (OSError, AttributeError):  # the thread just ended, or no per-thread clocks here
                pass
    return total


def _timed_sync(rank: int, data, checked: bool, version: int) -> tuple[float, float]:
    """One sync between two barriers: (wall seconds, CPU seconds of the caller's and the digest thread)."""
    import torch.distributed as dist

    dist.barrier()
    started, cpu = time.perf_counter(), _check_threads_cpu()
    (_send if rank == 0 else _receive)(data, checked, version)
    cpu = _check_threads_cpu() - cpu
    dist.barrier()
    return time.perf_counter() - started, cpu


def worker(rank: int, port: int, size: int, rounds: int, healthy: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    weights = model_weights(size)
    buffers = [(name, torch.empty_like(tensor)) for name, tensor in weights]
    data = weights if rank == 0 else buffers
    samples: dict[str, list] = {kind: [] for kind in KINDS}
    for round_ in range(rounds + 1):  # round 0 warms up
        for kind in ORDERS[round_ % len(ORDERS)]:
            sample = _timed_sync(rank, data, kind == "checked", round_)
            if round_:
                samples[kind].append(sample)
    intact = bool(all(torch.equal(a, b) for (_, a), (_, b) in zip(weights, buffers)))
    small = [w for w in data if w[0] in (weights[0][0], weights[1][0])]
    for version in range(1000, 1000 + healthy):  # many healthy checked syncs of a small stream: no alarm
        dist.barrier()
        (_send if rank == 0 else _receive)(small, True, version)
    from raysleuth.recorder import flush

    flush(30)
    dist.barrier()
    queue.put({"rank": rank, "samples": samples, "intact": intact})
    dist.destroy_process_group()


def transport_sync(size: int, rounds: int, healthy: int) -> dict[int, dict]:
    """Both ranks' samples, by rank."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    queue = context.Queue()
    processes = [context.Process(target=worker, args=(rank, port, size, rounds, healthy, queue)) for rank in (0, 1)]
    for process in processes:
        process.start()
    results = [queue.get(timeout=900) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    return {result["rank"]: result for result in results}


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """The median and a distribution-free interval holding it with >= 95 % confidence (order statistics).

    Ranks k and n+1-k with P(Binomial(n, 1/2) < k) <= 2.5 %; with fewer than
    6 values no such k exists and the interval is the whole range.
    """
    ordered, n = sorted(values), len(values)
    k, below = 0, 0.0
    while k < n and below + math.comb(n, k) / 2**n <= 0.025:
        below += math.comb(n, k) / 2**n
        k += 1
    low, high = (ordered[k - 1], ordered[n - k]) if k else (ordered[0], ordered[-1])
    return statistics.median(ordered), low, high


@dataclasses.dataclass
class Figure:
    """One way of reading the check's cost, per round, beside its A/A control."""

    name: str
    checked: list[float]
    """Per round: what the check adds, as a fraction of the plain sync's wall time."""
    control: list[float]
    """Per round: the same, between two plain syncs (the A/A control: zero but for noise)."""

    @property
    def resolution(self) -> float:
        """How far the control's 95 % interval reaches from zero: the smallest cost this run can tell."""
        _, low, high = median_interval(self.control)
        return max(abs(low), abs(high))

    def describe(self) -> str:
        cost, low, high = median_interval(self.checked)
        zero, zero_low, zero_high = median_interval(self.control)
        return (f"{self.name}: check {cost * 100:+.1f}% (95% interval {low * 100:+.1f}% to {high * 100:+.1f}%); "
                f"A/A control {zero * 100:+.1f}% ({zero_low * 100:+.1f}% to {zero_high * 100:+.1f}%)")


def figures(results: dict[int, dict]) -> tuple[Figure, Figure]:
    """Wall time (the sync as the job sees it) and the CPU the check adds on both callers' threads."""
    walls = {kind: [wall for wall, _ in results[1]["samples"][kind]] for kind in KINDS}  # the receiver ends the sync
    cpus = {kind: [a[1] + b[1] for a, b in zip(results[0]["samples"][kind], results[1]["samples"][kind])]
            for kind in KINDS}
    plain = walls["plain"]
    wall = Figure("wall time", [c / p - 1 for c, p in zip(walls["checked"], plain)],
                  [a / p - 1 for a, p in zip(walls["plain again"], plain)])
    fastest = min(plain)  # the sync least disturbed by other jobs: the CPU figure is not flattered by load
    cpu = Figure("CPU of both sides' callers' threads and digest threads over the fastest plain sync",
                 [(c - q) / fastest for c, q in zip(cpus["checked"], cpus["plain"])],
                 [(a - q) / fastest for a, q in zip(cpus["plain again"], cpus["plain"])])
    return wall, cpu


def judge(wall: Figure, cpu: Figure) -> None:
    """The < 5 % target, on the first figure whose A/A control resolves it (wall time first)."""
    for figure in (wall, cpu):
        if figure.resolution <= TARGET_OVERHEAD / 2:
            cost = median_interval(figure.checked)[0]
            target(f"checked sync < {TARGET_OVERHEAD:.0%} slower than plain ({figure.name.split(' over ')[0]})",
                   cost < TARGET_OVERHEAD, f"{cost * 100:+.1f}%, read against an A/A control within "
                   f"+-{figure.resolution * 100:.1f}%")
            return
    target(f"checked sync < {TARGET_OVERHEAD:.0%} slower than plain", False,
           f"cannot tell: the A/A controls reach +-{wall.resolution * 100:.1f}% (wall) and "
           f"+-{cpu.resolution * 100:.1f}% (CPU), wider than +-{TARGET_OVERHEAD / 2:.1%}; run it on a quieter "
           "machine or with more --rounds")


def colocated_copy(size: int, repeat: int) -> tuple[float, float]:
    import torch

    import raysleuth as rs

    weights = model_weights(size)
    engine = [torch.empty_like(tensor) for _, tensor in weights]

    def sync(checked: bool, version: int) -> float:
        started = time.perf_counter()
        stream = rs.weights_received(iter(weights), version=100_000 + version) if checked else iter(weights)
        for (_, tensor), target_buffer in zip(stream, engine):
            target_buffer.copy_(tensor)
        return time.perf_counter() - started

    sync(False, -1)  # first touch of the engine's buffers
    plain, checked = [], []
    for version in range(repeat):
        plain.append(sync(False, version))
        checked.append(sync(True, version))
    return statistics.median(plain), statistics.median(checked)


def healthy_syncs(home: Path, rounds: int, healthy: int) -> None:
    """Every checked sync of the run, read back from the store: each intact (both sides recorded), no alarm."""
    from raysleuth.weights import weights_report

    report = weights_report("local", home=home)
    checked = [sync for sync in report.syncs if sync.sent]
    bad = [f"{sync.version} ({sync.status})" for sync in report.syncs if not sync.intact]
    expected = rounds + 1 + healthy
    print(f"{len(checked)} checked syncs read back from the store, {len(bad)} not intact", flush=True)
    target(f"{expected} healthy syncs raise no alarm", len(checked) == expected and not bad and not report.problem,
           f"{len(checked)} syncs, not intact: {bad[:5]}")


def report_transport(size: int, results: dict[int, dict]) -> tuple[Figure, Figure]:
    """Print the rounds' figures; returns them for :func:`judge`."""
    walls = {kind: [wall for wall, _ in results[1]["samples"][kind]] for kind in KINDS}
    plain = statistics.median(walls["plain"])
    print(f"sync of {size / MiB:.0f} MiB over gloo (2 processes), {len(walls['plain'])} rounds of "
          f"{', '.join(KINDS)} in turn: median plain {plain * 1000:.1f} ms ({size / plain / 1024**3:.2f} GiB/s), "
          f"checked {statistics.median(walls['checked']) * 1000:.1f} ms (every round, ms: " + "; ".join(
              f"{kind} {[round(t * 1000) for t in walls[kind]]}" for kind in KINDS) + ")", flush=True)
    for rank, side in ((0, "sender"), (1, "receiver")):
        cpu = {kind: statistics.median(c for _, c in results[rank]["samples"][kind]) for kind in KINDS}
        print(f"{side}'s caller and digest threads, CPU per sync (median): plain {cpu['plain'] * 1000:.1f} ms, "
              f"plain again {cpu['plain again'] * 1000:.1f} ms, checked {cpu['checked'] * 1000:.1f} ms", flush=True)
    wall, cpu = figures(results)
    print(wall.describe(), flush=True)
    print(cpu.describe(), "(the most the check can add if none of it overlaps the transfer)", flush=True)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256M", help="bytes of weights per sync (default 256M; at least 256M)")
    parser.add_argument("--rounds", type=int, default=16,
                        help="rounds of plain, plain again and checked syncs, in turn (default 16)")
    parser.add_argument("--healthy", type=int, default=200,
                        help="healthy checked syncs of a small stream (default 200)")
    args = parser.parse_args()
    size, rounds, healthy = parse_size(args.size), min(900, max(1, args.rounds)), max(1, args.healthy)
    os.environ.setdefault("RAYSLEUTH_HOME", tempfile.mkdtemp(prefix="rs-bench-weights-"))
    results = transport_sync(size, rounds, healthy)
    wall, cpu = report_transport(size, results)
    healthy_syncs(Path(os.environ["RAYSLEUTH_HOME"]), rounds, healthy)
    copy_plain, copy_checked = colocated_copy(size, 5)
    print(f"not a target: a colocated sync that is only an in-memory copy: plain {copy_plain * 1000:.1f} ms, "
          f"checked {copy_checked * 1000:.1f} ms ({copy_checked / copy_plain:.2f}x: the check reads each byte once, "
          "as the copy does)", flush=True)
    target("weights arrived intact", results[1]["intact"], "receiver's buffers equal the sender's tensors")
    target("sync size >= 256 MiB", size >= 256 * MiB, f"{size / MiB:.0f} MiB")
    judge(wall, cpu)
    return exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
