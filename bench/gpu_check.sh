#!/usr/bin/env bash
# The GPU checks as one script, for a GPU machine (CI has none; `make test` skips these there):
# the CUDA tests, the CUDA fingerprint bench, and the CPU benches that want a quiet machine.
# Needs the python3 on PATH to have torch with CUDA; no Ray (none of these starts a cluster).
#     bench/gpu_check.sh
# Exits 1 when a test fails or a bench misses its target.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 - <<'PY'
import torch, torch.distributed  # noqa: F401
bindings = torch._C._distributed_c10d
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "|", torch.cuda.device_count(), "device(s):",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
print("NCCL", torch.cuda.nccl.version() if torch.cuda.is_available() else "-",
      "| Flight Recorder readers:", [name for name in dir(bindings) if name.startswith("_dump")])
PY
# raysleuth's own dependencies must be there (a GPU image may lack some: carry their wheels and pip install them)
python3 - <<'PY' || exit 1
import importlib.util, sys
missing = [name for name in ("orjson", "xxhash", "psutil", "numpy") if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f"gpu_check: missing {', '.join(missing)}: install them first (no network: pip download their wheels "
             "for this python elsewhere, carry them, pip install --no-index --no-deps)")
PY
rc=0
timeout 300 python3 -m pytest --noconftest -p no:cacheprovider -q -rA tests/test_cuda.py || rc=1
timeout 150 python3 bench/bench_fingerprint.py --cuda --size 1G || rc=1
timeout 150 python3 bench/bench_fingerprint.py || rc=1
timeout 200 python3 bench/bench_collectives.py || rc=1
exit $rc
