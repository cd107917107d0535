"""Pure stack logic without Ray: parsing py-spy JSON, folding, grouping, the verdict, wait-for chains."""

from __future__ import annotations

from raysleuth.stacks import ProcessStack, build_verdict, group_processes, headline, parse_py_spy
from raysleuth.stacks.analysis import fold_threads, signature

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
    split = [trainer(300, 0), trainer(301, 1, stuck=True)]
    assert build_verdict(split).culprits == []  # two peers: no majority


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
    tasks = [
        {"task_id": "t1", "parent_task_id": "f" * 40 + job, "name": "Coordinator.forward", "worker_pid": 2,
         "node_id": "n1", "state": "RUNNING"},
        {"task_id": "t2", "parent_task_id": "t1", "name": "Worker.compute", "worker_pid": 3, "node_id": "n2",
         "state": "RUNNING"},
    ]
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
