"""Fingerprint throughput vs numpy.sum and vs Megatron's check (fp32 upcast + SHA-1), in one run.

    .venv/bin/python bench/bench_fingerprint.py              # CPU, 256 MiB bf16 tensor
    .venv/bin/python bench/bench_fingerprint.py --size 1G    # bigger
    .venv/bin/python bench/bench_fingerprint.py --cuda       # GPU variant (skipped without CUDA)

CPU targets, for the default call ``rs.fingerprint(t)`` on a bf16 tensor: at
least 0.5x the speed of ``numpy.sum`` over the same bytes, at least 10x the
Megatron method; ``mix64`` in numpy (the rehash of mixed CPU/CUDA ranks) at
least 0.1x ``numpy.sum`` (it makes eight cache-resident passes per block of
words). CUDA targets: at least 50% of the device's memory bandwidth
(measured here as a device-to-device copy of the buffer), and at least 0.2x
torch's own int64 sum over the same words. Prints each
figure, its ratio, and PASS/MISS; exits 1 on a MISS.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from raysleuth.fingerprints import fingerprint  # noqa: E402
from _targets import exit_code, target  # noqa: E402  (bench/ is on sys.path when run as a script)

GiB = 1024**3


def parse_size(text: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": GiB}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def best_of(fn, repeat: int) -> float:
    """Fastest wall time of ``repeat`` runs (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def megatron_digest(tensor) -> str:
    """What Megatron's check_param_hashes_across_dp_replicas does per parameter: fp32 on CPU, then SHA-1."""
    import torch

    return hashlib.sha1(tensor.to(torch.float32).cpu().numpy().tobytes()).hexdigest()


def cpu(size: int, repeat: int) -> list[bool]:
    import torch

    print(f"CPU: {size / GiB:.2f} GiB bf16 tensor ({size // 2:,} elements), best of {repeat}")
    # A model shard as users hold it: bf16 torch tensor. numpy.sum reads the same bytes (as float32).
    tensor = torch.from_numpy(np.random.default_rng(0).standard_normal(size // 2, dtype=np.float32)).to(torch.bfloat16)
    same_bytes = tensor.view(torch.int16).numpy().view(np.float32)
    t_sum = best_of(lambda: np.sum(same_bytes), repeat)
    t_fp = best_of(lambda: fingerprint(tensor), repeat)  # the call as users write it: rs.fingerprint(t)
    t_mix = best_of(lambda: fingerprint(tensor, algorithm="mix64"), repeat)
    # Megatron on a slice (it needs 3x the memory and ~a second per GiB): throughput is linear in size.
    slice_elems = min(tensor.numel(), (128 * 1024**2) // 2)
    part = tensor[:slice_elems]
    t_mega = best_of(lambda: megatron_digest(part), 1) * (tensor.numel() / slice_elems)
    t_stats = best_of(lambda: fingerprint(tensor, stats=True), 1)

    def rate(seconds: float) -> str:
        return f"{size / seconds / GiB:7.2f} GiB/s ({seconds * 1000:8.1f} ms)"

    print(f"  numpy.sum (same bytes)              {rate(t_sum)}   baseline")
    print(f"  rs.fingerprint(t) (default, xxh3)   {rate(t_fp)}   {t_sum / t_fp:5.2f}x numpy.sum")
    print(f"  fingerprint mix64 numpy (CUDA alg)  {rate(t_mix)}   {t_sum / t_mix:5.2f}x numpy.sum")
    print(f"  fingerprint + float64 stats (opt-in){rate(t_stats)}   {t_sum / t_stats:5.2f}x numpy.sum")
    print(f"  Megatron fp32 upcast + SHA-1        {rate(t_mega)}   (measured on {slice_elems * 2 / GiB:.2f} GiB)")
    ok_sum = target("default rs.fingerprint vs numpy.sum", t_sum / t_fp >= 0.5, f"{t_sum / t_fp:.2f}x (>= 0.5x)")
    ok_mega = target("default rs.fingerprint vs Megatron", t_mega / t_fp >= 10, f"{t_mega / t_fp:.1f}x faster (>= 10x)")
    ok_mix = target("mix64 in numpy vs numpy.sum", t_sum / t_mix >= 0.1, f"{t_sum / t_mix:.2f}x (>= 0.1x)")
    return [ok_sum, ok_mega, ok_mix]


def cuda(size: int, repeat: int) -> list[bool]:
    try:
        import torch
    except ImportError:
        print("CUDA variant skipped: torch is not installed")
        return []
    if not torch.cuda.is_available():
        print("CUDA variant skipped: no CUDA device here (torch.cuda.is_available() is False); "
              "run `bench/bench_fingerprint.py --cuda` on a GPU machine")
        return []
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    tensor = torch.randint(-2**15, 2**15, (size // 2,), dtype=torch.int16, device=device).view(torch.bfloat16)

    def timed(fn):
        def run():
            fn()
            torch.cuda.synchronize()
        return best_of(run, repeat)

    t_copy = timed(lambda: tensor.clone())
    bandwidth = 2 * size / t_copy  # a copy reads and writes every byte
    t_sum = timed(lambda: tensor.view(torch.int16).sum(dtype=torch.int64))
    t_fp = timed(lambda: fingerprint(tensor, stats=False))
    t_stats = timed(lambda: fingerprint(tensor, stats=True))
    slice_elems = min(tensor.numel(), (256 * 1024**2) // 2)
    t_mega = timed(lambda: megatron_digest(tensor[:slice_elems])) * (tensor.numel() / slice_elems)
    sample = tensor[: 3 * 1024**2 + 5]
    same = fingerprint(sample, algorithm="mix64").digest == fingerprint(sample.cpu(), algorithm="mix64").digest
    print(f"CUDA ({name}): {size / GiB:.2f} GiB bf16 buffer, best of {repeat}")
    print(f"  copy bandwidth (read+write)      {bandwidth / GiB:8.1f} GiB/s   baseline")
    print(f"  torch int sum                    {size / t_sum / GiB:8.1f} GiB/s")
    print(f"  fingerprint mix64 on device      {size / t_fp / GiB:8.1f} GiB/s   "
          f"{size / t_fp / bandwidth:5.0%} of bandwidth, {t_sum / t_fp:5.2f}x torch int sum")
    print(f"  fingerprint + float64 stats      {size / t_stats / GiB:8.1f} GiB/s")
    print(f"  Megatron fp32 upcast + SHA-1     {size / t_mega / GiB:8.2f} GiB/s   {t_mega / t_fp:.0f}x slower")
    print(f"  CUDA and CPU mix64 digests equal: {same}")
    ok = target("fingerprint vs bandwidth", size / t_fp >= 0.5 * bandwidth, f"{size / t_fp / bandwidth:.0%} (>= 50%)")
    ok_sum = target("fingerprint vs torch int64 sum", t_sum / t_fp >= 0.2, f"{t_sum / t_fp:.2f}x (>= 0.2x)")
    target("CUDA and CPU mix64 digests equal", same, str(same))
    return [ok, ok_sum, same]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256M", help="buffer size, e.g. 256M (default), 1G")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cuda", action="store_true", help="run the CUDA variant instead")
    args = parser.parse_args()
    size = parse_size(args.size) // 8 * 8
    if args.cuda:
        cuda(size, args.repeat)
    else:
        cpu(size, args.repeat)
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
