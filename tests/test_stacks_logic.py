"""Pure stack logic without Ray: parsing py-spy JSON, folding, grouping, the verdict, wait-for chains."""

from __future__ import annotations

import pytest

from raysleuth.cluster.records import RayTask
from raysleuth.stacks import Culprit, ProcessStack, VerdictContext, build_verdict, group_processes, headline, parse_py_spy
from raysleuth.stacks.analysis import fold_threads, key_thread, signature

SITE = "/venv/lib/python3.11/site-packages/"


def frame(name, file, line, short=None):
    return {"name": name, "filename": file, "short_filename": short or file.rsplit("/", 1)[-1], "line": line}


RAY_BOTTOM = [
    frame("FunctionActorManager._make_actor_method_executor.<locals>.actor_method_executor",
          SITE + "ray/_private/function_manager.py", 740, "ray/_private/function_manager.py"),
    frame("Worker.main_loop", SITE + "ray/_private/worker.py", 1069, "ray/_private/worker.py"),
    frame("<module>", SITE + "ray/_private/workers/default_worker.py", 323, "ray/_private/workers/default_worker.py"),
]
RAY_GET = [
    frame("Worker.get_objects", SITE + "ray/_private/worker.py", 1007, "ray/_private/worker.py"),
    frame("get", SITE + "ray/_private/worker.py", 3009, "ray/_private/worker.py"),
    frame("wrap_auto_init.<locals>.auto_init_wrapper", SITE + "ray/_private/auto_init_hook.py", 22,
          "ray/_private/auto_init_hook.py"),
]


def thread(pid, frames, *, name="MainThread", active=False, os_thread_id=None):
    return {"thread_name": name, "thread_id": 1, "os_thread_id": os_thread_id or pid, "active": active,
            "owns_gil": False, "frames": frames}


def idle_background(pid):
    return thread(pid, [frame("Condition.wait", "/usr/lib/python3.11/threading.py", 320)], name="bg",
                  os_thread_id=pid + 1)


def trainer(pid, rank, stuck=False):
    user = [frame("Trainer.load_batch", "/job/data.py", 41)] if stuck else RAY_GET + [
        frame("Trainer.all_reduce", "/job/trainer.py", 88)]
    raw = [thread(pid, user + [frame("Trainer.train_step", "/job/trainer.py", 60)] + RAY_BOTTOM),
           idle_background(pid)]
    threads, folded = fold_threads(parse_py_spy(raw, pid=pid), include_idle=False)
    return ProcessStack(pid=pid, node_ip="10.0.0.1", role="actor", actor_class="Trainer", rank=rank,
                        task_name="Trainer.train_step", threads=threads, folded_threads=folded)


def test_parse_roles_and_folding():
    pid = 10
    threads = parse_py_spy([idle_background(pid), thread(pid, RAY_GET + RAY_BOTTOM)], pid=pid)
    assert [t.role for t in threads] == ["task", "background"]
    assert threads[0].idle and threads[0].frames[0].function == "Worker.get_objects"
    kept, folded = fold_threads(threads, include_idle=False)
    assert folded == 1 and [t.role for t in kept] == ["task"]
    # an idle main thread is never folded
    main_only = parse_py_spy([thread(pid, [frame("main", "/job/driver.py", 5)])], pid=pid)
    assert fold_threads(main_only, include_idle=False) == (main_only, 0)
    assert fold_threads(threads, include_idle=True)[1] == 0


def test_grouping_and_majority_verdict():
    procs = [trainer(100 + rank, rank, stuck=(rank == 3)) for rank in range(8)]
    groups = group_processes(procs)
    assert [g.count for g in groups] == [7, 1]
    assert groups[0].ranks == [0, 1, 2, 4, 5, 6, 7]
    assert groups[0].headline == "waiting in Trainer.all_reduce (trainer.py:88) → ray.get"
    assert groups[1].ranks == [3] and groups[1].headline == "waiting in Trainer.load_batch (data.py:41)"
    # Ray's executor plumbing is not part of the frames that matter
    assert [f.function for f in groups[1].frames] == ["Trainer.load_batch", "Trainer.train_step"]
    verdict = build_verdict(procs)
    assert [(c.rank, c.pid, c.function, c.line) for c in verdict.culprits] == [(3, 103, "Trainer.load_batch", 41)]
    assert "7 of 8 Trainer" in verdict.culprits[0].reason
    assert verdict.summary.startswith("culprit: rank 3 (Trainer)")


def test_no_culprit_when_peers_are_busy_or_split():
    busy = []
    for rank in range(4):
        raw = [thread(200 + rank, [frame("Trainer.forward", "/job/model.py", 10 + (rank == 2))] + RAY_BOTTOM,
                      active=True)]
        busy.append(ProcessStack(pid=200 + rank, role="actor", actor_class="Trainer", rank=rank,
                                 threads=parse_py_spy(raw, pid=200 + rank)))
    assert build_verdict(busy).culprits == []  # a busy majority is training, not hanging
    # a peer that works (on CPU) while the others wait in the collective is progress, not a culprit
    computing = [trainer(310 + rank, rank) for rank in range(3)]
    computing[1].threads[0].idle = False
    assert build_verdict(computing).culprits == []


def test_wait_for_chain_blames_its_end():
    job = "01000000"
    driver = ProcessStack(pid=1, node_id="n1", node_ip="10.0.0.1", role="driver", job_id=job,
                          threads=parse_py_spy([thread(1, RAY_GET + [frame("<module>", "/job/driver.py", 12)])], pid=1))
    middle = ProcessStack(pid=2, node_id="n1", node_ip="10.0.0.1", role="actor", actor_class="Coordinator",
                          threads=parse_py_spy([thread(2, RAY_GET + [frame("Coordinator.forward", "/job/a.py", 9)]
                                                       + RAY_BOTTOM)], pid=2))
    end = ProcessStack(pid=3, node_id="n2", node_ip="10.0.0.2", role="actor", actor_class="Worker",
                       threads=parse_py_spy([thread(3, [frame("slow_compute", "/job/b.py", 20),
                                                        frame("Worker.compute", "/job/b.py", 15)] + RAY_BOTTOM)], pid=3))
    tasks = [RayTask.from_state(row) for row in [
        {"task_id": "t1", "parent_task_id": "f" * 40 + job, "name": "Coordinator.forward", "worker_pid": 2,
         "node_id": "n1", "state": "RUNNING"},
        {"task_id": "t2", "parent_task_id": "t1", "name": "Worker.compute", "worker_pid": 3, "node_id": "n2",
         "state": "RUNNING"},
    ]]
    verdict = build_verdict([driver, middle, end], tasks)
    assert len(verdict.chains) == 1
    chain = verdict.chains[0]
    assert [(link.pid, link.task_name, link.waiting) for link in chain] == [
        (1, None, True), (2, "Coordinator.forward", True), (3, "Worker.compute", False)]
    assert [(c.pid, c.function) for c in verdict.culprits] == [(3, "slow_compute")]
    assert "Coordinator.forward → Worker.compute" in verdict.culprits[0].reason
    # an end idle in a library wait (event loop, lock) is not blamed: it waits on something unseen
    end.threads = parse_py_spy([thread(3, [frame("EpollSelector.select", "/usr/lib/python3.11/selectors.py", 468)]
                                       + RAY_BOTTOM)], pid=3)
    assert build_verdict([driver, middle, end], tasks).culprits == []


def test_headline_for_errors_and_idle_workers():
    broken = ProcessStack(pid=5, error="permission denied")
    assert headline(broken) == "no stack: permission denied"
    assert signature(broken)[0] == "<no stack>"
    idle = ProcessStack(pid=6, role="idle worker", threads=parse_py_spy([thread(6, RAY_BOTTOM[1:])], pid=6))
    assert headline(idle) == "idle in Ray's task loop (nothing running)"


# ---------------------------------------------------------------- real-job shapes (issue 19)

TORCH = SITE + "torch/"
ALL_REDUCE = [
    frame("all_reduce", TORCH + "distributed/distributed_c10d.py", 3000, "torch/distributed/distributed_c10d.py"),
    frame("_exception_logger.<locals>.wrapper", TORCH + "distributed/c10d_logger.py", 81,
          "torch/distributed/c10d_logger.py"),
]
BACKWARD = [
    frame("_engine_run_backward", TORCH + "autograd/graph.py", 979, "torch/autograd/graph.py"),
    frame("backward", TORCH + "autograd/__init__.py", 395, "torch/autograd/__init__.py"),
    frame("Tensor.backward", TORCH + "_tensor.py", 623, "torch/_tensor.py"),
]
TRAIN_PLUMBING = [
    frame("construct_train_func.<locals>.train_fn", SITE + "ray/train/v2/_internal/util.py", 89,
          "ray/train/v2/_internal/util.py"),
    frame("ThreadRunner.run.<locals>._run_target", SITE + "ray/train/v2/_internal/execution/worker_group/thread_runner.py",
          37, "ray/train/v2/_internal/execution/worker_group/thread_runner.py"),
    frame("Thread.run", "/usr/lib/python3.11/threading.py", 982),
]


def sampled(moved):
    """What two samples measured: frames that moved, or the same frames with no CPU and no wake-ups."""
    if moved is None:
        return {}
    return {"moved_frames": moved, "counters": None if moved else {"cpu": 0.0, "switches": 0, "window": 2.0}}


def ddp_rank(pid, rank, inner, *, active=False, moved=None):
    """A gloo DDP actor (rank from its environment): the main thread runs the train call."""
    raw = [thread(pid, inner + [frame("DDPRank.train", "/job/ddp.py", 70)] + RAY_BOTTOM, active=active),
           idle_background(pid)]
    threads, folded = fold_threads(parse_py_spy(raw, pid=pid), include_idle=False)
    return ProcessStack(pid=pid, node_ip="10.0.0.1", role="actor", actor_class="DDPRank", rank=rank,
                        rank_source="environment", task_name="DDPRank.train", threads=threads,
                        folded_threads=folded, job_id="02000000", **sampled(moved))


def train_worker(pid, rank, inner, *, active=False, moved=None):
    """A Ray Train v2 worker: main thread idle in Ray's loop, the user's code on TrainingThread(...)."""
    raw = [thread(pid, RAY_BOTTOM[1:]),
           thread(pid, [frame("ThreadRunner._monitor_target", SITE + "ray/train/v2/_internal/execution/worker_group/"
                              "thread_runner.py", 72, "ray/train/v2/_internal/execution/worker_group/thread_runner.py")],
                  name="MonitoringThread(train_fn_with_final_checkpoint_flush)", os_thread_id=pid + 1),
           thread(pid, inner + [frame("train_loop_per_worker", "/job/train.py", 118)] + TRAIN_PLUMBING,
                  name="TrainingThread(train_fn_with_final_checkpoint_flush)", os_thread_id=pid + 2, active=active)]
    threads, folded = fold_threads(parse_py_spy(raw, pid=pid), include_idle=False)
    return ProcessStack(pid=pid, node_ip="10.0.0.1", role="actor", actor_class="RayTrainWorker", rank=rank,
                        rank_source="ray train", threads=threads, folded_threads=folded, **sampled(moved))


STUCK_LOADER = [frame("next_batch", "/job/ddp.py", 64)]


def test_ray_train_training_thread_is_the_key_thread_and_never_folded():
    worker = train_worker(50, 1, [frame("fetch_batch", "/job/train.py", 100)])
    assert [t.role for t in worker.threads] == ["main", "training"]  # the monitor thread is folded
    assert key_thread(worker).name.startswith("TrainingThread(")
    assert headline(worker) == "waiting in fetch_batch (train.py:100)"
    # Ray Train's thread runner is plumbing: not part of the frames that matter
    assert [f.function for f in group_processes([worker])[0].frames] == ["fetch_batch", "train_loop_per_worker"]
    # any other thread that runs user code is kept as well
    raw = [thread(60, RAY_BOTTOM[1:]), thread(60, [frame("prefetch", "/job/loader.py", 5)], name="Thread-3",
                                              os_thread_id=61)]
    assert [t.role for t in fold_threads(parse_py_spy(raw, pid=60), include_idle=False)[0]] == ["main", "training"]


def test_collective_headline_names_the_collective():
    rank = ddp_rank(70, 0, ALL_REDUCE)
    assert headline(rank) == "waiting in DDPRank.train (ddp.py:70) → all_reduce (torch.distributed)"
    assert "_exception_logger" not in headline(rank)
    assert headline(train_worker(71, 0, BACKWARD)).endswith("→ backward (torch.autograd: DDP's gradient all-reduce)")


@pytest.mark.parametrize("make, inner, cls", [(ddp_rank, ALL_REDUCE, "DDPRank"), (train_worker, BACKWARD, "RayTrainWorker")])
def test_peers_name_the_stuck_rank_also_in_a_group_of_two(make, inner, cls):
    for world in (2, 3):
        procs = [make(80 + r, r, STUCK_LOADER if r == 1 else inner, moved=False) for r in range(world)]
        verdict = build_verdict(procs, context=VerdictContext(samples=2))
        assert [(c.rank, c.rule, c.rank_source) for c in verdict.culprits] == [
            (1, "peers", procs[1].rank_source)], verdict
        assert verdict.state == "culprit" and verdict.problem
        assert f"{world - 1} of {world} {cls} peers" in verdict.culprits[0].reason


def test_two_samples_tell_hung_from_busy():
    hung = [ddp_rank(90 + r, r, ALL_REDUCE, moved=False) for r in range(3)]
    verdict = build_verdict(hung, context=VerdictContext(samples=2))
    assert verdict.culprits == [] and verdict.state == "hung" and verdict.problem
    assert verdict.summary.startswith("hung: every rank waits in all_reduce (torch.distributed); no rank stands apart")
    assert verdict.next_command
    # one sample: the same stacks cannot tell, so no alarm, and a note says how to tell
    once = [ddp_rank(90 + r, r, ALL_REDUCE) for r in range(3)]
    verdict = build_verdict(once, context=VerdictContext(samples=1))
    assert not verdict.problem and any("--once" in note for note in verdict.notes)
    # stacks that moved between the samples: busy, exit 0
    busy = [ddp_rank(90 + r, r, ALL_REDUCE, moved=True) for r in range(3)]
    verdict = build_verdict(busy, context=VerdictContext(samples=2))
    assert (verdict.state, verdict.problem, verdict.culprits) == ("busy", False, [])
    # a healthy DDP job: one rank computes (moving) while its peers sit in all_reduce
    healthy = [ddp_rank(95 + r, r, ALL_REDUCE, moved=False) for r in range(3)]
    healthy[2] = ddp_rank(97, 2, [frame("forward", "/job/model.py", 9)], active=True, moved=True)
    verdict = build_verdict(healthy, context=VerdictContext(samples=2))
    assert not verdict.problem and verdict.state == "busy"
    assert any("rank 2" in note and "raysleuth stragglers" in note for note in verdict.notes)  # slow, not hung


def _driver_chain(ends):
    job = "03000000"
    driver = ProcessStack(pid=1, node_id="n1", node_ip="10.0.0.1", role="driver", job_id=job,
                          threads=parse_py_spy([thread(1, RAY_GET + [frame("<module>", "/job/driver.py", 12)])], pid=1))
    tasks = [RayTask.from_state({"task_id": f"t{p.pid}", "parent_task_id": "f" * 40 + job, "name": "DDPRank.train",
                                 "worker_pid": p.pid, "node_id": "n1", "state": "RUNNING"}) for p in ends]
    for p in ends:
        p.node_id = "n1"
    return [driver] + ends, tasks


def test_a_chain_ending_in_working_ranks_is_progress():
    working = [ddp_rank(110 + r, r, [frame("forward", "/job/model.py", 9 + r)], moved=True) for r in range(3)]
    procs, tasks = _driver_chain(working)
    verdict = build_verdict(procs, tasks, context=VerdictContext(samples=2))
    assert len(verdict.chains) == 3 and verdict.culprits == [] and verdict.state == "busy"
    # the same chain ending in a rank blocked in user code names it, by the chain rule
    blocked = [ddp_rank(120, 0, [frame("slow", "/job/ddp.py", 3)], moved=False)]
    procs, tasks = _driver_chain(blocked)
    verdict = build_verdict(procs, tasks, context=VerdictContext(samples=2))
    assert [(c.pid, c.rule) for c in verdict.culprits] == [(120, "wait-for chain")]


def test_dead_peer_is_the_culprit():
    peers = [ddp_rank(130 + r, r, ALL_REDUCE, moved=False) for r in (0, 2)]
    dead = {"actor_class": "DDPRank", "rank": 1, "pid": 131, "node_ip": "10.0.0.1", "job_id": "02000000",
            "cause": "WORKER_DIED: its worker process has died (SYSTEM_ERROR)", "on_purpose": False,
            "rank_source": "runtime_env"}
    verdict = build_verdict(peers, context=VerdictContext(dead=[dead], samples=2))
    assert [(c.rank, c.pid, c.rule) for c in verdict.culprits] == [(1, 131, "dead peer")]
    assert "WORKER_DIED" in verdict.culprits[0].reason and "all_reduce" in verdict.culprits[0].reason
    # killed on purpose, of another job, or alive again: not a culprit
    for change in ({"on_purpose": True}, {"job_id": "09000000"}, {"rank": 2}):
        assert build_verdict(peers, context=VerdictContext(dead=[{**dead, **change}], samples=2)).state == "hung"


def test_a_call_that_did_not_return_while_its_peers_did():
    ranks = [ddp_rank(140, 0, [], moved=False), ddp_rank(141, 1, [frame("generate", "/job/w.py", 8)], moved=False)]
    ranks[0].threads = parse_py_spy([thread(140, RAY_BOTTOM[1:])], pid=140)
    ranks[0].task_name = None  # rank 0 returned: idle in Ray's loop
    calls = [{"kind": "verl_call", "method": "generate_sequences", "rank": r, "returned": r == 0, "submitted": 100.0,
              "worker_pid": 140 + r} for r in (0, 1)]
    verdict = build_verdict(ranks, context=VerdictContext(calls=calls, samples=2))
    assert [(c.rank, c.rule) for c in verdict.culprits] == [(1, "call not returned")]
    verdict = build_verdict(ranks[1:], context=VerdictContext(calls=calls, samples=2))
    assert [(c.rank, c.rule) for c in verdict.culprits] == [(1, "call not returned")]
    assert "has not returned from generate_sequences" in verdict.culprits[0].reason
    # a call whose process is not among those read (gone, another job) names no one
    assert build_verdict(ranks[1:], context=VerdictContext(calls=[{**c, "worker_pid": 9} for c in calls])).culprits == []


def test_extra_rules_hook():
    procs = [ddp_rank(150 + r, r, ALL_REDUCE, moved=False) for r in range(2)]

    def behind(processes, context):
        return [Culprit(pid=151, node_ip="10.0.0.1", rank=1, reason="behind in the collective sequence (7 < 8)",
                        rule="collective position")]

    def broken(processes, context):
        raise RuntimeError("boom")

    verdict = build_verdict(procs, context=VerdictContext(samples=2), extra_rules=[broken, behind])
    assert [(c.rank, c.rule) for c in verdict.culprits] == [(1, "collective position")]
    assert any("boom" in note for note in verdict.notes)


def test_progress_is_measured_from_counters_not_frames():
    from raysleuth.stacks.progress import classify, thread_deltas

    stuck = ddp_rank(160, 0, STUCK_LOADER)
    tid = key_thread(stuck).os_thread_id
    # same frames, no CPU and no wake-ups of the key thread: blocked (whatever other threads do)
    stuck.moved_frames = False
    stuck.counters = thread_deltas({tid: {"cpu": 1.0, "switches": 5}, 7: {"cpu": 1.0, "switches": 0}},
                                   {tid: {"cpu": 1.0, "switches": 5}, 7: {"cpu": 9.0, "switches": 900}}, tid, 2.0)
    assert classify(stuck, 2) == "blocked" and stuck.progress == []
    # same line twice, but the thread woke 40 times: a loop that sleeps between steps is active, not blocked
    stuck.counters = {"cpu": 0.0, "switches": 40, "window": 2.0}
    assert classify(stuck, 2) == "active" and stuck.progress == ["woke 40 times in 2.0s"]
    # a progress counter moved (heartbeat, collectives, Ray calls): working, whatever the frames
    stuck.counters = {"cpu": 0.0, "switches": 0, "window": 2.0}
    stuck.progress = ["collectives 120 → 180"]
    assert classify(stuck, 2) == "working"
    # a checkpoint being written moves I/O: working
    stuck.progress, stuck.counters = [], {"cpu": 0.0, "switches": 0, "io": 8 << 20, "window": 2.0}
    assert classify(stuck, 2) == "working" and stuck.progress == ["8.0 MiB of I/O"]
    # an fsync longer than the window: no bytes through system calls, but in the kernel's wait on a device (D)
    # at a read of its counters, and woken by its completions: working; in D and never woken (a mount that
    # hangs): blocked, as before
    stuck.progress = []
    stuck.counters = thread_deltas({tid: {"cpu": 1.0, "switches": 5, "io": 0, "disk_wait": 1.0}},
                                   {tid: {"cpu": 1.0, "switches": 45, "io": 0, "disk_wait": 1.0}}, tid, 2.0)
    assert classify(stuck, 2) == "working", stuck.progress
    assert stuck.progress == ["disk I/O wait (state D at 2 of 2 reads, woke 40 times in 2.0s)"]
    stuck.progress, stuck.counters = [], {"cpu": 0.0, "switches": 0, "io": 0, "disk_wait": 2.0, "window": 2.0}
    assert classify(stuck, 2) == "blocked" and stuck.progress == []
    stuck.counters = {"cpu": 0.0, "switches": 40, "io": 0, "disk_wait": 0.0, "window": 2.0}  # woke, never in D
    assert classify(stuck, 2) == "active" and stuck.progress == ["woke 40 times in 2.0s"]
    stuck.counters = {"cpu": 0.0, "switches": 40, "io": 0, "disk_wait": 1.0, "window": 2.0}
    assert classify(stuck, 1) == "active"  # one sample measures nothing
    # frames changed: working; one sample: py-spy's on-CPU flag only says active
    stuck.counters, stuck.moved_frames = None, True
    assert classify(stuck, 2) == "working"
    stuck.moved_frames = None
    stuck.threads[0].idle = False
    assert classify(stuck, 1) == "active"


def test_collective_positions_name_the_rank_that_skipped_while_every_rank_waits_in_all_reduce():
    # every rank sits in all_reduce (the stacks alone say "hung"); the collective matcher knows who skipped
    ranks = [ddp_rank(140 + r, r, ALL_REDUCE, moved=False) for r in range(3)]
    assert build_verdict(ranks, context=VerdictContext(samples=2)).state == "hung"
    skipped = {"rank": 1, "pid": 141, "node_ip": "10.0.0.1", "kind": "skipped", "file": "/job/ddp.py", "line": 61,
               "reason": "rank 1 is one collective behind: ranks 0,2 called all_reduce(float32[1]) as #9 at step 4, "
                         "rank 1 called all_reduce(float32[64,64]) — rank 1 skipped one (ddp.py:61)"}
    ranks = [ddp_rank(140 + r, r, ALL_REDUCE, moved=False) for r in range(3)]
    verdict = build_verdict(ranks, context=VerdictContext(samples=2, collective_positions=[skipped]))
    assert [(c.rank, c.pid, c.rule, c.line) for c in verdict.culprits] == [(1, 141, "collective positions", 61)]
    assert verdict.state == "culprit" and "skipped one" in verdict.culprits[0].reason
    # the process that gloo aborted is not blamed first when the positions name another rank
    dead = {"actor_class": "DDPRank", "rank": 2, "pid": 142, "node_ip": "10.0.0.1", "cause": "SIGABRT",
            "on_purpose": False}
    alive = [p for p in ranks if p.rank != 2]
    verdict = build_verdict(alive, context=VerdictContext(samples=2, dead=[dead], collective_positions=[skipped]))
    assert [c.rule for c in verdict.culprits][0] == "collective positions"
    # a dump left by an earlier job on the same cluster names none of this job's processes: not a culprit
    stale = dict(skipped, pid=9141)
    ranks = [ddp_rank(140 + r, r, ALL_REDUCE, moved=False) for r in range(3)]
    verdict = build_verdict(ranks, context=VerdictContext(samples=2, collective_positions=[stale]))
    assert verdict.state == "hung" and verdict.culprits == []
    # the rank that skipped and was then aborted is named: a dead actor of this job
    aborted = dict(dead, rank=1, pid=141, job_id="02000000")
    alive = [p for p in ranks if p.rank != 1]
    verdict = build_verdict(alive, context=VerdictContext(samples=2, dead=[aborted], collective_positions=[skipped]))
    assert [(c.rank, c.rule) for c in verdict.culprits] == [(1, "collective positions")]


def test_idle_in_rays_loop_is_returned_unless_an_event_loop_awaits():
    from raysleuth.stacks.verdict import classify

    loop = thread(170, [frame("BaseEventLoop.run_forever", "/usr/lib/python3.11/asyncio/base_events.py", 608,
                              "asyncio/base_events.py")], name="AsyncIO Thread: default", os_thread_id=171)
    raw = [thread(170, RAY_BOTTOM[1:]), loop]
    stale = ProcessStack(pid=170, role="actor", actor_class="ToyWorker", task_name="ToyWorker.ping")
    stale.threads = parse_py_spy(raw[:1], pid=170)
    assert classify(stale) == "returned"  # the State API still names a call that already finished
    assert headline(stale) == "idle in Ray's task loop (nothing running)"
    awaiting = ProcessStack(pid=170, role="actor", actor_class="Controller", task_name="Controller.run",
                            event_loop=True, threads=parse_py_spy(raw, pid=170))
    assert classify(awaiting) == "waiting" and "awaits (async actor)" in headline(awaiting)


# ---------------------------------------------------------------- the wait-for graph (issue 23)

BROADCAST = [frame("broadcast", TORCH + "distributed/distributed_c10d.py", 2700, "torch/distributed/distributed_c10d.py")]


def test_ranks_in_different_ops_name_the_minority_and_an_even_split_names_no_one():
    ranks = [ddp_rank(400 + r, r, BROADCAST if r == 1 else ALL_REDUCE, moved=False) for r in range(3)]
    verdict = build_verdict(ranks, context=VerdictContext(samples=2))
    assert [(c.rank, c.rule) for c in verdict.culprits] == [(1, "peers")], verdict
    assert "the ops differ" in verdict.culprits[0].reason and "2 of 3 DDPRank peers" in verdict.culprits[0].reason
    assert sorted(item.rank for item in verdict.consequences) == [0, 2]
    # 2 vs 2: no majority, so no side is named
    even = [ddp_rank(410 + r, r, BROADCAST if r in (1, 3) else ALL_REDUCE, moved=False) for r in range(4)]
    verdict = build_verdict(even, context=VerdictContext(samples=2))
    assert verdict.culprits == [] and verdict.state == "hung"


def test_a_call_queued_behind_a_busy_actor_closes_a_cycle():
    job = "04000000"
    driver = ProcessStack(pid=1, node_id="n1", node_ip="10.0.0.1", role="driver", job_id=job,
                          threads=parse_py_spy([thread(1, RAY_GET + [frame("<module>", "/job/driver.py", 12)])], pid=1))
    learner = ProcessStack(pid=2, node_id="n1", node_ip="10.0.0.1", role="actor", actor_class="Learner", actor_id="aL",
                           job_id=job, threads=parse_py_spy([thread(2, RAY_GET + [frame("Learner.train", "/job/l.py", 9)]
                                                                    + RAY_BOTTOM)], pid=2), **sampled(False))
    server = ProcessStack(pid=3, node_id="n1", node_ip="10.0.0.1", role="actor", actor_class="ParamServer",
                          actor_id="aS", job_id=job,
                          threads=parse_py_spy([thread(3, RAY_GET + [frame("ParamServer.apply", "/job/s.py", 4)]
                                                       + RAY_BOTTOM)], pid=3), **sampled(False))
    tasks = [RayTask.from_state(row) for row in [
        {"task_id": "t1", "parent_task_id": "f" * 40 + job, "name": "Learner.train", "worker_pid": 2, "node_id": "n1",
         "state": "RUNNING", "actor_id": "aL"},
        {"task_id": "t2", "parent_task_id": "t1", "name": "ParamServer.apply", "worker_pid": 3, "node_id": "n1",
         "state": "RUNNING", "actor_id": "aS"},
        {"task_id": "t3", "parent_task_id": "t2", "name": "Learner.ack", "state": "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY",
         "actor_id": "aL"},
    ]]
    verdict = build_verdict([driver, learner, server], tasks, context=VerdictContext(samples=2))
    assert verdict.state == "deadlock" and verdict.exit_code == 1
    assert sorted(c.actor_class for c in verdict.culprits) == ["Learner", "ParamServer"]
    assert {e.kind for e in verdict.edges} == {"ray call", "queued call"}
    assert [(item.pid, item.because) for item in verdict.consequences] == [(1, "waits in ray.get for Learner.train")]
    # without the queued call the chain simply ends in a process that waits on nothing we see: hung, not a cycle
    verdict = build_verdict([driver, learner, server], tasks[:2], context=VerdictContext(samples=2))
    assert verdict.state == "hung" and verdict.culprits == []


def test_a_stuck_coroutine_is_the_root_cause_and_its_caller_a_consequence():
    job = "05000000"
    loop = thread(500, [frame("BaseEventLoop.run_forever", "/usr/lib/python3.11/asyncio/base_events.py", 608,
                              "asyncio/base_events.py")], name="AsyncIO Thread: default", os_thread_id=501)
    engine = ProcessStack(pid=500, node_id="n1", node_ip="10.0.0.1", role="actor", actor_class="Engine", job_id=job,
                          task_name="Engine.generate", event_loop=True,
                          threads=parse_py_spy([thread(500, RAY_BOTTOM[1:]), loop], pid=500), **sampled(False))
    stuck = {"task": "Task-7", "awaits": "asyncio Event.wait", "waited_s": 42.0,
             "frames": [{"function": "Engine.generate", "file": "/job/engine.py", "line": 31},
                        {"function": "Event.wait", "file": "/usr/lib/python3.11/asyncio/locks.py", "line": 213}]}
    fresh = [{"task": f"Task-{i}", "awaits": "asyncio sleep", "waited_s": 0.1, "frames": []} for i in range(3)]
    engine.coroutines = [stuck] + fresh
    driver = ProcessStack(pid=1, node_id="n1", node_ip="10.0.0.1", role="driver", job_id=job,
                          threads=parse_py_spy([thread(1, RAY_GET + [frame("<module>", "/job/driver.py", 12)])], pid=1))
    tasks = [RayTask.from_state({"task_id": "t1", "parent_task_id": "f" * 40 + job, "name": "Engine.generate",
                                 "worker_pid": 500, "node_id": "n1", "state": "RUNNING"})]
    verdict = build_verdict([driver, engine], tasks, context=VerdictContext(samples=2, window=2.0))
    assert verdict.state == "culprit" and [c.rule for c in verdict.culprits] == ["coroutine"]
    culprit = verdict.culprits[0]
    assert (culprit.function, culprit.line) == ("Engine.generate", 31) and "Event.wait" in culprit.reason
    assert [item.pid for item in verdict.consequences] == [1]
    # the same engine with no coroutine listing: hung, and the note says how to see them
    engine.coroutines = None
    verdict = build_verdict([driver, engine], tasks, context=VerdictContext(samples=2, window=2.0))
    assert verdict.state == "hung" and any("coroutines are invisible" in note for note in verdict.notes)


def test_an_async_controller_awaiting_unseen_work_is_explained_by_its_jobs_progress():
    """Ray Train's controller awaits a 2 s timer between polls of its workers: in a window between polls no
    call of it is listed and its loop may wake once. With its job's workers making progress the job is busy;
    with nothing of its job moving (a hung async engine) it stays hung."""
    job = "06000000"
    loop = thread(600, [frame("BaseEventLoop.run_forever", "/usr/lib/python3.11/asyncio/base_events.py", 608,
                              "asyncio/base_events.py")], name="AsyncIO Thread: default", os_thread_id=601)

    def shapes(workers_move):
        controller = ProcessStack(pid=600, node_id="n1", node_ip="10.0.0.1", role="actor",
                                  actor_class="TrainController", job_id=job, task_name="TrainController.run",
                                  event_loop=True, threads=parse_py_spy([thread(600, RAY_BOTTOM[1:]), loop], pid=600),
                                  **sampled(False))
        driver = ProcessStack(pid=1, node_id="n1", node_ip="10.0.0.1", role="driver", job_id=job,
                              threads=parse_py_spy([thread(1, RAY_GET + [frame("<module>", "/job/d.py", 9)])], pid=1))
        workers = [ddp_rank(610 + r, r, [frame("train_func", "/job/train.py", 30)], moved=workers_move)
                   for r in range(2)]
        for worker in workers:
            worker.job_id = job
        return [driver, controller, *workers]

    tasks = [RayTask.from_state({"task_id": "t1", "parent_task_id": "f" * 40 + job, "name": "TrainController.run",
                                 "worker_pid": 600, "node_id": "n1", "state": "RUNNING"})]
    verdict = build_verdict(shapes(True), tasks, context=VerdictContext(samples=2))
    assert verdict.state == "busy" and verdict.exit_code == 0, verdict.summary
    alone = [p for p in shapes(True) if p.actor_class != "DDPRank"]  # an engine whose job has nothing else moving
    verdict = build_verdict(alone, tasks, context=VerdictContext(samples=2))
    assert verdict.state == "hung" and verdict.exit_code == 1, verdict.summary
    seen = shapes(True)
    seen[1].coroutines = []  # its coroutines are listed (the setup hook) and none awaits: nothing unseen to excuse it
    verdict = build_verdict(seen, tasks, context=VerdictContext(samples=2))
    assert verdict.state == "hung", verdict.summary


def test_the_watchdogs_stall_is_a_rule_of_the_verdict_not_a_rewrite():
    """Ranks the stall watchdog saw make no step progress are named by the verdict itself (rule
    ``heartbeat stall``), even where the stacks alone read a busy job; an unread rank is still named."""
    from raysleuth.stacks import stalled_ranks_rule

    ranks = [ddp_rank(700 + r, r, [frame("train_func", "/job/train.py", 30)], moved=True) for r in range(3)]
    assert build_verdict(ranks, context=VerdictContext(samples=2)).state == "busy"
    rule = stalled_ranks_rule([{"rank": 1, "pid": 701, "node_ip": "10.0.0.1", "reason": "no heartbeat progress for 9s"},
                               {"rank": 5, "pid": 999, "node_ip": "10.0.0.9", "reason": "no heartbeat progress for 9s"}])
    verdict = build_verdict(ranks, context=VerdictContext(samples=2), extra_rules=[rule])
    assert verdict.state == "culprit" and verdict.exit_code == 1
    named = {(c.rank, c.rule) for c in verdict.culprits}
    assert named == {(1, "heartbeat stall"), (5, "heartbeat stall")}, verdict.summary
    by_rank = {c.rank: c for c in verdict.culprits}
    assert by_rank[1].function == "train_func" and "no heartbeat progress for 9s" in by_rank[1].reason
    assert "not found" in by_rank[5].reason


def test_a_skipped_collective_has_one_root_cause_and_its_victims_are_consequences():
    """rank 1 skipped all_reduce; gloo aborted rank 0; rank 3's call errored; ranks 1 and 2 wait."""
    ranks = [ddp_rank(600 + r, r, ALL_REDUCE, moved=False) for r in (1, 2)]
    ranks.append(ddp_rank(603, 3, [], moved=False))
    ranks[-1].threads = parse_py_spy([thread(603, RAY_BOTTOM[1:])], pid=603)
    ranks[-1].task_name, ranks[-1].node_id = None, "n1"
    aborted = {"actor_class": "DDPRank", "actor_name": None, "rank": 0, "pid": 600, "node_ip": "10.0.0.1",
               "job_id": "02000000", "cause": "WORKER_DIED: Fatal Python error: Aborted (gloo::transport::tcp::Pair)",
               "on_purpose": False}
    errored = {("n1", 603): "RuntimeError: [../gloo/transport/tcp/pair.cc:537] Connection closed by peer"}
    skipped = {"rank": 1, "pid": 601, "node_ip": "10.0.0.1", "kind": "skipped", "file": "/job/ddp.py", "line": 61,
               "reason": "rank 1 skipped all_reduce #13"}
    context = VerdictContext(samples=2, dead=[aborted], failed=errored, collective_positions=[skipped])
    verdict = build_verdict(ranks, context=context)
    assert [(c.rank, c.rule) for c in verdict.culprits] == [(1, "collective positions")]
    assert sorted(item.rank for item in verdict.consequences) == [0, 2, 3], verdict.consequences
    # the same job with raysleuth only imported (no positions): neither the aborted rank nor the one whose call
    # errored is blamed; the verdict says it cannot tell
    verdict = build_verdict(ranks, context=VerdictContext(samples=2, dead=[aborted], failed=errored))
    assert verdict.culprits == [] and verdict.state == "hung", verdict


def test_two_verl_groups_are_two_groups_and_an_idle_one_is_not_blamed():
    busy = [ddp_rank(700 + r, r, ALL_REDUCE, moved=False) for r in range(2)]
    busy[1] = ddp_rank(701, 1, [frame("compute", "/job/w.py", 5)], active=True, moved=True)
    idle = [ddp_rank(710 + r, r, [], moved=False) for r in range(2)]
    for group, procs in (("abcdefWorkerDict", busy), ("ghijklWorkerDict", idle)):
        for proc in procs:
            proc.actor_class, proc.actor_name = "WorkerDict", f"{group}_0:{proc.rank}"
    for proc in idle:
        proc.threads = parse_py_spy([thread(proc.pid, RAY_BOTTOM[1:])], pid=proc.pid)
        proc.task_name = None
    verdict = build_verdict(busy + idle, context=VerdictContext(samples=2))
    assert (verdict.state, verdict.culprits) == ("busy", []), verdict
    assert len({p.group for p in busy + idle}) == 2


def test_exit_codes_follow_the_state():
    from raysleuth.stacks import StackVerdict

    assert [StackVerdict(state=state).exit_code for state in ("ok", "busy", "hung", "unsure", "unread")] == [0, 0, 1, 2, 2]
    assert build_verdict([]).state == "unread" and build_verdict([]).exit_code == 2


def test_a_thousand_ranks_give_one_root_cause_and_a_short_reason():
    import time

    ranks = [ddp_rank(10000 + r, r, STUCK_LOADER if r == 7 else ALL_REDUCE, moved=False) for r in range(1000)]
    started = time.perf_counter()
    verdict = build_verdict(ranks, context=VerdictContext(samples=2))
    assert time.perf_counter() - started < 5.0  # 0.05 s on a quiet 2-core machine: each sink is judged once
    assert [c.rank for c in verdict.culprits] == [7] and len(verdict.consequences) == 999
    assert "ranks 0-6,8-999" in verdict.culprits[0].reason and len(verdict.culprits[0].reason) < 300
