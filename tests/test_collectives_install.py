"""raysleuth.collectives.install in a bare process (no Ray): what a worker setup hook does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


def test_light_ring_keeps_every_field_its_readers_need(tmp_path):
    """Light mode (the default) on a real gloo pair whose rank 1 never joins the 4th all_reduce, torch's Flight
    Recorder off (the wrapper is the only source): the dump taken while rank 0 waits must give the matcher,
    the stragglers' enter times and the stacks verdict's positions what they read."""
    port = _free_port()
    init = f"""
        import os, sys, time
        os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
        import raysleuth.collectives as collectives
        collectives.install()
        import torch, torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=int(os.environ["RANK"]),
                                world_size=2)
        group = dist.new_group([0, 1], group_desc="weight_sync")
        for _ in range(3):
            dist.all_reduce(torch.ones(4, 2))
        dist.broadcast(torch.ones(3), src=0, group=group)
    """
    rank0 = init + """
        import json, threading
        from raysleuth import runtime
        from raysleuth.collectives.record import snapshot
        def dump():
            time.sleep(1.0)
            print(json.dumps(snapshot("test")), flush=True)
            os._exit(0)
        threading.Thread(target=dump).start()
        runtime.set_step(7)
        dist.all_reduce(torch.ones(2))  # WAITS HERE
    """
    line = next(n for n, text in enumerate(textwrap.dedent(rank0).splitlines(), 1) if "WAITS HERE" in text)
    peer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(init + "\n        time.sleep(60)\n")],
                            env=dict(os.environ, PYTHONPATH=str(ROOT / "src"), RAYSLEUTH_HOME=str(tmp_path), RANK="1"))
    try:
        result = run(rank0, RAYSLEUTH_HOME=str(tmp_path), RANK="0")
    finally:
        peer.kill()
        peer.wait()
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["flight_recorder"] is None or not data["flight_recorder"]["entries"], data["flight_recorder"]
    calls = [c for c in data["calls"] if c["op"] != "barrier"]
    assert {key for c in calls for key in c} >= {"pg", "seq", "op", "state", "start_ns", "end_ns", "file", "line",
                                                  "function", "step", "input", "call"}
    assert [(c["op"], c["state"]) for c in calls] == [("all_reduce", "completed")] * 3 + [
        ("broadcast", "completed"), ("all_reduce", "started")], calls
    assert all(0 < c["start_ns"] <= c["end_ns"] for c in calls[:4]) and calls[-1]["end_ns"] is None, calls
    assert calls[-1]["step"] == 7 and calls[0]["step"] is None
    assert all(c["file"] is None for c in calls[:4])  # light mode: no frame per call...
    waiting = calls[-1]  # ...but the call still running has its caller's file:line, read from its live stack
    assert (waiting["file"], waiting["function"], waiting["line"]) == ("<string>", "<module>", line), waiting

    from raysleuth.collectives.model import entries_from_dump
    from raysleuth.collectives.matcher import collective_culprits
    from raysleuth.stragglers.sources import calls_from_records

    default = entries_from_dump(data)["0"]  # the matcher's positions
    assert [(e.seq, e.op, e.state) for e in default.values()][-2:] == [(3, "all_reduce", "completed"),
                                                                       (4, "all_reduce", "pending")], default
    assert default[4].line == line and default[4].step == 7 and default[4].created
    sync = [g for g in entries_from_dump(data) if g != "0"]
    assert sync and entries_from_dump(data)[sync[0]][1].op == "broadcast"
    record = {"data": data, "time": data["time"], "rank": 0, "pid": data["pid"]}
    mine = [c for c in calls_from_records([record]).calls[0] if c.group == "0"]  # the stragglers' enter and exit times
    assert [(c.op, c.seq) for c in mine] == [("all_reduce", n) for n in range(1, 5)]
    assert all(c.enter_ns and c.exit_ns for c in mine[:3]) and mine[-1].exit_ns is None
    returned = [dict(c, state="completed", end_ns=c["start_ns"] + 1) for c in data["calls"][:-1]]
    peer_record = {"data": {**data, "rank": 1, "pid": data["pid"] + 1, "time": data["time"] + 10, "calls": returned},
                   "rank": 1}
    waiting_record = dict(record, data=dict(data, time=data["time"] + 10))
    culprits = collective_culprits([waiting_record, peer_record], pending_after=0.5)  # the stacks verdict's rule
    assert [(c["rank"], c["kind"]) for c in culprits] == [(1, "stuck")], culprits
    assert (culprits[0]["file"], culprits[0]["line"]) == ("<string>", line), culprits  # where it never arrived


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_light_wrapper_never_raises_into_the_call_and_keeps_the_newest_whole_entries():
    from raysleuth.collectives import hook

    class BrokenGroup:
        @property
        def group_name(self):
            raise RuntimeError("not the wrapper's business")

    def all_reduce(tensor, op=None, group=None, async_op=False):
        if tensor == "fail":
            raise ValueError("the collective's own error")
        return tensor

    wrapped = hook._wrap("all_reduce", all_reduce)
    before = list(hook._ring)
    assert wrapped("ok", group=BrokenGroup()) == "ok"  # the bookkeeping failed: the call still ran
    assert list(hook._ring) == before  # ...and nothing half-made went into the ring
    hook.name_default_group("bench")
    try:
        for k in range(hook.RING_SIZE + 88):
            assert wrapped(k) == k
        with pytest.raises(ValueError):
            wrapped("fail")
        kept = [e for e in hook.entries() if e["pg"] == "bench"]
    finally:
        hook.name_default_group(None)
    assert len(kept) == hook.RING_SIZE and [e["seq"] for e in kept] == sorted(e["seq"] for e in kept)
    assert kept[-1]["state"] == "error" and kept[-1]["end_ns"] >= kept[-1]["start_ns"] > 0
    assert {e["state"] for e in kept[:-1]} == {"completed"} and all(e["file"] is None for e in kept)


def test_detail_armed_on_demand_records_each_calls_file_line_and_shapes():
    """The control key ``collectives.detail`` (its handler, as the control thread calls it) arms full mode's
    detail in a light-mode worker from the next call on, and disarms it."""
    import torch

    from raysleuth.collectives import hook, record

    def all_reduce(tensor, op=None, group=None, async_op=False):
        return tensor

    wrapped = hook._wrap("all_reduce", all_reduce)
    hook.name_default_group("armed")
    try:
        wrapped(torch.ones(2, 3))
        record._on_detail(True)
        line = sys._getframe().f_lineno + 1
        wrapped(torch.ones(2, 3))
        record._on_detail(False)
        wrapped(torch.ones(2, 3))
        calls = [e for e in hook.entries() if e["pg"] == "armed"][-3:]
    finally:
        hook.name_default_group(None)
        hook.set_detail(False)
    assert [(c["line"], c["input"]) for c in calls] == [(None, []), (line, [[[2, 3], "float32"]]), (None, [])], calls
    assert calls[1]["file"] == __file__ and calls[1]["call"] == 1


def test_the_wrapper_takes_the_collectives_own_parameters_and_passes_every_argument_on():
    """Each collective's wrapper is written with its own parameters (no *args/**kwargs packing on the hot path):
    a parameter named like the wrapper's own state (``op``) reaches the collective, keyword-only ones too, and a
    function with ``*args`` gets the forwarding form; a stack shows the wrapper as raysleuth's own frame."""
    import inspect
    import linecache

    from raysleuth.collectives import hook, wrapper

    def all_reduce(tensor, op="sum", group=None, async_op=False, *, timeout=5):
        return tensor, op, group, async_op, timeout

    def barrier(*args, **kwargs):
        return args, kwargs

    wrapped, forwarding = hook._wrap("all_reduce", all_reduce), hook._wrap("barrier", barrier)
    assert "*" not in str(inspect.signature(wrapped).parameters.get("tensor"))
    hook.name_default_group("own")
    try:
        assert wrapped("t") == ("t", "sum", None, False, 5)
        assert wrapped("t", "max", async_op=True, timeout=9) == ("t", "max", None, True, 9)
        assert forwarding(1, group=None, extra=2) == ((1,), {"group": None, "extra": 2})
        entries = [entry for entry, _ in hook.raw_entries() if entry[hook._PG] == "own"]
    finally:
        hook.name_default_group(None)
    assert [(e[hook._OP], e[hook._ASYNC]) for e in entries] == [("all_reduce", False), ("all_reduce", True),
                                                                ("barrier", False)]
    code = wrapped.__code__
    assert code.co_filename == wrapper.FILE and code.co_name == "collective" == forwarding.__code__.co_name
    assert linecache.getline(wrapper.FILE, code.co_firstlineno).startswith("def collective(")
    assert "_rs_args" not in code.co_varnames and "_rs_args" in forwarding.__code__.co_varnames


def test_a_dump_holds_the_newest_entries_per_group_that_readers_read_and_answers_as_a_longer_one(tmp_path):
    """A dump keeps :data:`ENTRIES_PER_GROUP` per process group, the newest (it kept 256, three quarters never
    read): a worker's dump cut so gives every reader the same positions as the longer dump it used to write."""
    result = run(f"""
        import socket
        import raysleuth.collectives as collectives
        collectives.install()
        import torch, torch.distributed as dist
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=0, world_size=1)
        group = dist.new_group([0], group_desc="weight_sync")
        from raysleuth.collectives.model import ENTRIES_PER_GROUP, positions_from_dumps
        from raysleuth.collectives.record import snapshot
        from raysleuth.collectives.report import _read_dumps
        from raysleuth.recorder.store import EvidenceStore
        for n in range(ENTRIES_PER_GROUP + 40):
            dist.all_reduce(torch.ones(2))
            if n % 20 == 0:
                dist.broadcast(torch.ones(3), src=0, group=group)
        from raysleuth.collectives.model import MAX_ENTRIES, WINDOW_ENTRIES, entries_asked as limit_of
        assert [limit_of(r) for r in (None, {{"id": "a"}}, {{"limit": WINDOW_ENTRIES}}, {{"limit": "9"}}, {{"limit": -1}},
                                       {{"limit": 10**6}})] == [ENTRIES_PER_GROUP] * 2 + [WINDOW_ENTRIES] + [ENTRIES_PER_GROUP] * 2 + [MAX_ENTRIES]
        # what `raysleuth stragglers` asks for (its window of calls) against what every other dump holds
        cut, longer = snapshot("request"), snapshot("request", limit=limit_of({{"id": "s", "limit": WINDOW_ENTRIES}}))
        seqs = {{}}
        for call in cut["calls"]:
            seqs.setdefault(call["pg"], []).append(call["seq"])
        default = [pg for pg in seqs if len(seqs[pg]) > 10][0]
        assert seqs[default] == list(range(41, ENTRIES_PER_GROUP + 41)), seqs   # the newest, in order
        assert [len(v) for pg, v in seqs.items() if pg != default] == [6], seqs  # a short group keeps all
        assert len(longer["calls"]) == ENTRIES_PER_GROUP + 46
        from raysleuth.collectives.matcher import match
        answers = []
        for name, data in (("cut", cut), ("longer", longer)):
            store = EvidenceStore("{tmp_path}/" + name + ".sqlite")
            store.write_batch({{"pid": 1, "client_id": "c"}}, [("collectives", 1.0, 0, None, None, "request", "INFO",
                                                              data, 1)])
            positions = positions_from_dumps(_read_dumps(store, None)[1])
            newest = {{g: sorted((s, e.describe(), e.state) for s, e in entries.items())[-ENTRIES_PER_GROUP:]
                      for g, entries in positions[0].groups.items()}}
            answers.append((newest, match(positions).to_dict()))
        assert answers[0] == answers[1] and len(answers[0][0][default]) == ENTRIES_PER_GROUP, answers
        print("ok")
    """, RAYSLEUTH_HOME=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
