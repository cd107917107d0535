"""The timeline on the real cluster: two ranks' spans merged with Ray task events, plus the straggler summary."""

from __future__ import annotations

import json

import ray
from polling import poll

from raysleuth import cluster
from raysleuth.cli import main
from raysleuth.recorder import open_store
from raysleuth.timeline import build_timeline, timeline_summary
from victims.task_forensics import Worker


def test_timeline_merges_ranks_spans_and_ray_tasks(ray_cluster, tmp_path, capsys):
    workers = [Worker.options(name=f"timeline_rank{rank}").remote(rank=rank) for rank in (0, 1)]
    try:
        for step in range(3):  # rank 1 is the straggler
            ray.get([worker.step.remote(step, 0.02 if rank == 0 else 0.3) for rank, worker in enumerate(workers)],
                    timeout=60)
        assert all(ray.get([worker.flush.remote() for worker in workers], timeout=60))
        pids = ray.get([worker.pid.remote() for worker in workers], timeout=60)

        def finished_steps():  # Ray's task events arrive late: wait for them before building (it reads the whole run)
            return [task for pid in pids for task in cluster.tasks(worker_pid=pid, state="FINISHED")
                    if task.name == "Worker.step"]

        poll(finished_steps, lambda found: len(found) >= 6, timeout=60)
        timeline = build_timeline(ray_cluster.address, home=ray_cluster.home, ranks=[0, 1])
        step_ids = {e["args"].get("task_id") for e in timeline.events if e.get("cat") == "ray_task"
                    and e["name"] == "Worker.step" and e["args"].get("state") == "FINISHED"}
        assert len(step_ids) >= 6, "every Worker.step call should appear as a Ray task event"

        output = tmp_path / "trace.json"
        code = main(["timeline", "-o", str(output), "--ranks", "0,1", "--address", ray_cluster.address,
                     "--home", str(ray_cluster.home)])
        assert code == 0 and "wrote" in capsys.readouterr().out
        trace = json.loads(output.read_text())
        events = trace["traceEvents"]
        for event in events:
            assert {"ph", "pid", "tid", "ts"} <= set(event) and isinstance(event["pid"], int)
            if event["ph"] == "X":
                assert event["dur"] >= 0 and isinstance(event["args"], dict)
        spans = [e for e in events if e.get("cat") == "span"]
        tasks = [e for e in events if e.get("cat") == "ray_task" and e["name"] == "Worker.step"]
        assert {e["args"]["rank"] for e in spans if e["name"] == "forward"} == {0, 1}
        assert {e["args"]["step"] for e in spans if e["name"] == "forward"} == {0, 1, 2}
        assert any(e["ph"] == "i" and e["name"] == "loss" for e in events)
        names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
        assert any(name.startswith("rank 0 · Worker") for name in names)
        assert any(name.startswith("rank 1 · Worker") for name in names)
        # nesting: each forward span sits inside a train_step span and a Ray task on the same track
        for forward in (e for e in spans if e["name"] == "forward"):
            track = (forward["pid"], forward["tid"])
            end = forward["ts"] + forward["dur"]
            assert any((t["pid"], t["tid"]) == track and t["ts"] <= forward["ts"] + 1000 and end <= t["ts"] + t["dur"] + 1000
                       for t in tasks), "a span must nest inside its Ray task"
            assert any(s["name"] == "train_step" and (s["pid"], s["tid"]) == track and s["ts"] <= forward["ts"]
                       and end <= s["ts"] + s["dur"] for s in spans)

        rows = [row for row in timeline_summary(home=ray_cluster.home, ranks=[0, 1]) if row.phase == "forward"]
        assert {row.step for row in rows} == {0, 1, 2}
        assert all(row.slowest == "1" and row.lag_s > 0.1 for row in rows), rows

        code = main(["timeline", "--summary", "--json", "--steps", "1-2", "--ranks", "0,1",
                     "--home", str(ray_cluster.home)])
        payload = json.loads(capsys.readouterr().out)
        assert code == 0 and {row["step"] for row in payload["summary"]} == {1, 2}
        assert open_store(home=ray_cluster.home).count("span") > 0

        # --job: a cluster shared by several jobs; another job's timeline holds none of these spans or tasks
        mine = ray.get_runtime_context().get_job_id()
        ours = build_timeline(ray_cluster.address, home=ray_cluster.home, jobs=[mine])
        assert {e["args"]["rank"] for e in ours.events if e.get("cat") == "span" and e["name"] == "forward"} == {0, 1}
        assert step_ids <= {e["args"].get("task_id") for e in ours.events if e.get("cat") == "ray_task"}
        other = build_timeline(ray_cluster.address, home=ray_cluster.home, jobs=["7f000000"], ranks=[0, 1])
        assert other.spans == 0 and other.ray_tasks == 0
        code = main(["timeline", "--summary", "--json", "--job", "7f000000", "--home", str(ray_cluster.home)])
        assert code == 0 and json.loads(capsys.readouterr().out)["summary"] == []
    finally:
        for worker in workers:
            ray.kill(worker)


def test_timeline_needs_output_or_summary(ray_cluster, capsys):
    assert main(["timeline", "--home", str(ray_cluster.home)]) == 2
    assert main(["timeline", "--summary", "--steps", "9-3", "--home", str(ray_cluster.home)]) == 2
