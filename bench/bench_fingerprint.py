"""Fingerprint throughput vs numpy.sum and vs Megatron's check (fp32 upcast + SHA-1), in one run.

    .venv/bin/python bench/bench_fingerprint.py              # CPU, 1 GiB buffer
    .venv/bin/python bench/bench_fingerprint.py --size 256M  # smaller, for loaded machines
    .venv/bin/python bench/bench_fingerprint.py --cuda       # GPU variant (skipped without CUDA)

CPU targets: at least 0.5x the speed of ``numpy.sum`` over the same buffer,
at least 10x the Megatron method. CUDA target: at least 50% of the device's
memory bandwidth (measured here as a device-to-device copy of the buffer).
Prints each figure, its ratio, and PASS/MISS; ``--strict`` exits 1 on a MISS.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from raysleuth.fingerprint import fingerprint  # noqa: E402

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

    print(f"CPU: {size / GiB:.2f} GiB float32 buffer ({size // 4:,} elements), best of {repeat}")
    # One buffer of normal float32 values (a model shard) for every contender.
    as_f32 = np.random.default_rng(0).standard_normal(size // 4, dtype=np.float32)
    tensor = torch.from_numpy(as_f32)
    t_sum = best_of(lambda: np.sum(as_f32), repeat)
    t_fp = best_of(lambda: fingerprint(tensor, stats=False), repeat)
    t_wsum = best_of(lambda: fingerprint(tensor, stats=False, algorithm="wsum"), max(1, repeat - 1))
    # Megatron on a slice (it needs 3x the memory and ~a second per GiB): throughput is linear in size.
    slice_elems = min(tensor.numel(), (256 * 1024**2) // 4)
    part = tensor[:slice_elems]
    t_mega = best_of(lambda: megatron_digest(part), 1) * (tensor.numel() / slice_elems)
    t_stats = best_of(lambda: fingerprint(tensor, stats=True), 1)

    def rate(seconds: float) -> str:
        return f"{size / seconds / GiB:7.2f} GiB/s ({seconds * 1000:8.1f} ms)"

    print(f"  numpy.sum (same bytes, float32)   {rate(t_sum)}   baseline")
    print(f"  fingerprint xxh3 (bitwise)        {rate(t_fp)}   {t_sum / t_fp:5.2f}x numpy.sum")
    print(f"  fingerprint wsum numpy (CUDA alg) {rate(t_wsum)}   {t_sum / t_wsum:5.2f}x numpy.sum")
    print(f"  fingerprint + float64 stats       {rate(t_stats)}   {t_sum / t_stats:5.2f}x numpy.sum")
    print(f"  Megatron fp32 upcast + SHA-1      {rate(t_mega)}   (measured on {slice_elems * 4 / GiB:.2f} GiB; "
          "fp32 input is its best case)")
    ok_sum = t_sum / t_fp >= 0.5
    ok_mega = t_mega / t_fp >= 10
    print(f"  fingerprint vs numpy.sum: {t_sum / t_fp:.2f}x (target >= 0.5x) {'PASS' if ok_sum else 'MISS'}")
    print(f"  fingerprint vs Megatron:  {t_mega / t_fp:.1f}x faster (target >= 10x) {'PASS' if ok_mega else 'MISS'}")
    return [ok_sum, ok_mega]


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
    same = fingerprint(sample, algorithm="wsum").digest == fingerprint(sample.cpu(), algorithm="wsum").digest
    print(f"CUDA ({name}): {size / GiB:.2f} GiB bf16 buffer, best of {repeat}")
    print(f"  copy bandwidth (read+write)      {bandwidth / GiB:8.1f} GiB/s   baseline")
    print(f"  torch int sum                    {size / t_sum / GiB:8.1f} GiB/s")
    print(f"  fingerprint wsum on device       {size / t_fp / GiB:8.1f} GiB/s   "
          f"{size / t_fp / bandwidth:5.0%} of bandwidth")
    print(f"  fingerprint + float64 stats      {size / t_stats / GiB:8.1f} GiB/s")
    print(f"  Megatron fp32 upcast + SHA-1     {size / t_mega / GiB:8.2f} GiB/s   {t_mega / t_fp:.0f}x slower")
    print(f"  CUDA and CPU wsum digests equal: {same}")
    ok = size / t_fp >= 0.5 * bandwidth
    print(f"  fingerprint vs bandwidth: {size / t_fp / bandwidth:.0%} (target >= 50%) {'PASS' if ok else 'MISS'}")
    return [ok, same]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G", help="buffer size, e.g. 1G (default), 256M")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cuda", action="store_true", help="run the CUDA variant instead")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()
    size = parse_size(args.size) // 8 * 8
    results = cuda(size, args.repeat) if args.cuda else cpu(size, args.repeat)
    return 1 if args.strict and not all(results) else 0


if __name__ == "__main__":
    sys.exit(main())
