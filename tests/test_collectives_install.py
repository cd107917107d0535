"""raysleuth.collectives.install in a bare process (no Ray): what a worker setup hook does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **env)
    environment.pop("TORCH_FR_BUFFER_SIZE", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment, capture_output=True,
                          text=True, timeout=120)


def test_install_wraps_when_the_job_imports_torch_distributed_and_records_the_user_frame(tmp_path):
    result = run(f"""
        import os, socket, sys
        import raysleuth.collectives as collectives
        collectives.install()
        assert "torch" not in sys.modules                        # the hook does not import torch itself
        assert os.environ["TORCH_FR_BUFFER_SIZE"] == "2000"      # full mode: before any process group exists
        import torch
        import torch.distributed as dist
        assert dist.all_reduce.__raysleuth_collective__
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=0, world_size=1)
        group = dist.new_group([0], group_desc="weight_sync")
        line = sys._getframe().f_lineno + 2
        for _ in range(3):
            dist.all_reduce(torch.ones(4, 2))
        dist.broadcast(torch.ones(3, dtype=torch.float64), src=0, group=group)
        from raysleuth.collectives.record import snapshot
        from raysleuth.collectives.model import entries_from_dump
        data = snapshot("test")
        assert data["rank"] == 0 and data["flight_recorder"]["entries"], data
        groups = entries_from_dump(data)
        default, sync = groups["0"], groups[[k for k in groups if k != "0"][0]]
        assert [e.describe() for e in default.values()] == ["all_reduce(float32[4,2])"] * 3
        assert [e.line for e in default.values()] == [line] * 3 and default[3].call == 3, default
        assert sync[1].describe() == "broadcast(float64[3])"
        assert any(g["desc"] == "weight_sync" for g in data["groups"].values())
        print("ok")
    """, RAYSLEUTH_MODE="full", RAYSLEUTH_HOME=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def test_light_mode_keeps_the_wrapper_with_start_and_end_times_and_leaves_the_flight_recorder_alone(tmp_path):
    """The default mode must cost < 2 % (bench/bench_collectives.py): the wrapper, and torch's Flight Recorder
    as the job has it (torch 2.13 keeps one by default; raysleuth switches it on only in full mode)."""
    result = run(f"""
        import os, socket, sys
        import raysleuth.collectives as collectives
        collectives.install()
        assert "TORCH_FR_BUFFER_SIZE" not in os.environ          # light (the default): torch's own setting
        import torch
        import torch.distributed as dist
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=0, world_size=1)
        for _ in range(3):
            dist.all_reduce(torch.ones(4, 2))
        from raysleuth.collectives.record import snapshot
        data = snapshot("test")
        calls = [call for call in data["calls"] if call["op"] == "all_reduce"]
        assert len(calls) == 3 and all(c["state"] == "completed" for c in calls), calls
        assert all(0 < c["start_ns"] <= c["end_ns"] for c in calls), calls   # what straggler detection reads
        assert [c["seq"] for c in calls] == sorted(c["seq"] for c in calls)
        print("ok")
    """, RAYSLEUTH_HOME=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def test_install_is_a_no_op_when_off_and_never_raises_without_torch():
    off = run("""
        import os, threading, raysleuth.collectives as c
        c.install()
        assert "TORCH_FR_BUFFER_SIZE" not in os.environ
        assert not [t for t in threading.enumerate() if t.name.startswith("raysleuth")]
        print("ok")
    """, RAYSLEUTH_MODE="off")
    assert off.returncode == 0 and off.stdout.strip() == "ok", off.stderr[-2000:]
    no_torch = run("""
        import sys
        sys.modules["torch"] = None                              # torch missing
        import raysleuth.collectives as c
        c.install(); c.install()
        assert c.dump("test") is None
        try:
            import torch.distributed
        except ImportError:
            print("ok")
    """)
    assert no_torch.returncode == 0 and no_torch.stdout.strip() == "ok", no_torch.stderr[-2000:]
