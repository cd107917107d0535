"""`raysleuth run` on unmodified training jobs: gloo DDP on Ray actors, and a Ray Train TorchTrainer.

Neither job imports raysleuth. Ranks must come from where the jobs put
them (torch.distributed's init_process_group; Ray Train's worker group),
the failing rank's capsule must carry that rank with its secrets redacted,
and the job's exit code and error must be its own.
"""

from __future__ import annotations

import shutil

import pytest
from zero_code_run import run_job


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    job = run_job("zero_code_ddp.py", "--steps", "6", "--fail-step", "3", "--fail-rank", "1",
                  tmp=tmp_path_factory.mktemp("ddp"))
    yield job
    shutil.rmtree(job.ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    job = run_job("zero_code_train.py", "--fail-step", "2", "--fail-rank", "1", tmp=tmp_path_factory.mktemp("train"))
    yield job
    shutil.rmtree(job.ray_tmp, ignore_errors=True)


def test_ddp_job_fails_as_it_would_alone(ddp):
    assert ddp.returncode == 1, ddp.stderr[-3000:]  # the driver's uncaught error, as without raysleuth
    assert "FloatingPointError: loss became nan at step 3" in ddp.stderr
    steps = [line.split(":")[0] for line in ddp.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["step 0", "step 1", "step 2"]  # the steps before the failure, printed by the job


def test_ddp_capsule_has_the_torch_distributed_rank_and_no_secrets(ddp):
    store = ddp.store()
    crashes = store.query("crash")
    assert [(c.name, c.rank) for c in crashes] == [("DataParallelWorker.update", 1)]
    capsule = crashes[0].data
    assert capsule["rank"] == 1 and capsule["world_size"] == 2
    assert capsule["exception_type"] == "FloatingPointError"
    frame = next(f for f in capsule["frames"] if f.get("function", "").endswith(".update"))
    assert frame["locals"]["hub_token"] == "<redacted>"
    assert "hf_AbCdEf" not in str(capsule)
    ranks = {event.pid: event.data for event in store.query("event", name="rank")}
    assert sorted(data["rank"] for data in ranks.values()) == [0, 1]
    assert {data["rank_source"] for data in ranks.values()} == {"torch.distributed"}
    assert crashes[0].pid in ranks and ranks[crashes[0].pid]["rank"] == 1


def test_ray_train_job_ranks_labelled_and_crash_captured(train):
    assert train.returncode == 1, train.stderr[-3000:]  # TrainingFailedError reaches the driver, as without raysleuth
    assert "corrupt batch at step 2" in train.stderr
    store = train.store()
    crashes = [c for c in store.query("crash") if c.data["exception_type"] == "ValueError"]
    assert len(crashes) == 1
    capsule = crashes[0]
    assert capsule.rank == 1 and capsule.actor_class == "RayTrainWorker"
    assert "corrupt batch at step 2" in capsule.data["message"]
    frame = next(f for f in capsule.data["frames"] if f.get("function", "").endswith("train_loop_per_worker"))
    assert frame["locals"]["wandb_api_key"] == "<redacted>"
    ranks = {event.pid: event.data["rank"] for event in store.query("event", name="rank")
             if event.actor_class == "RayTrainWorker"}
    assert sorted(ranks.values()) == [0, 1]
    classes = {event.actor_class for event in store.query("event", name="instrumented")}
    assert {"RayTrainWorker", "TrainController"} <= classes  # every worker of the job, Ray Train's own included
