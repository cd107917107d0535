"""Weight syncs on a real cluster: a trainer and a rollout worker as Ray actors, a real verl CheckpointEngine.

The engine is a custom gloo backend (``victims/gloo_checkpoint_engine.py``),
registered in verl's ``CheckpointEngineRegistry`` and created by
``CheckpointEngineRegistry.new`` as verl's workers create theirs. Both
actors run under the zero-code setup hook, so raysleuth wraps the engines
itself: the trainer's code has no raysleuth in it. The trainer trains a tiny
Qwen2 (transformers, random init) one step per sync; the rollout loads into
two tensor-parallel ranks of a vLLM-style fused model and checks them.

One run of 27 syncs: 20 healthy, then one of each fault, then a healthy one.
Each fault must be named right by ``raysleuth weights`` and its library call.
"""

from __future__ import annotations

import pytest
from polling import poll

pytest.importorskip("verl")
pytest.importorskip("transformers")

import ray  # noqa: E402

from raysleuth.cli import main  # noqa: E402

BASE = 5000  # the session's run holds other modules' syncs at low versions (test_weights_logic's bad streams)
HEALTHY = list(range(BASE + 1, BASE + 21))
STALE, CORRUPT, DROP, CAST, CAST_SWAP, SHARD, AFTER = range(BASE + 21, BASE + 28)
FAULTS = {
    STALE: {"transport": {"stale": True}},
    CORRUPT: {"transport": {"corrupt": "model.norm.weight"}},
    DROP: {"transport": {"drop": "model.layers.0.mlp.up_proj.weight"}},
    CAST: {"dtype": "bfloat16"},
    CAST_SWAP: {"dtype": "bfloat16", "loader": {"swap_qk": True}},
    SHARD: {"loader": {"skip": "model.layers.1.mlp.down_proj.weight"}, "shard": 1},
}
LAST = AFTER


def _env(rank: int) -> dict:
    """The runtime_env of a job started with ``worker_process_setup_hook="raysleuth.setup_worker"``.

    The shared cluster's driver was started without the hook, so each actor gets it the way ``ray.init``
    gives it to every worker of a job: Ray's own conversion into the environment variable its workers read.
    """
    from ray._private.runtime_env.setup_hook import upload_worker_process_setup_hook_if_needed
    from ray._private.worker import global_worker

    runtime_env = {"worker_process_setup_hook": "raysleuth.setup_worker",
                   "env_vars": {"RANK": str(rank), "WORLD_SIZE": "2", "RAYSLEUTH_MODE": "light"}}
    runtime_env = upload_worker_process_setup_hook_if_needed(runtime_env, global_worker)
    runtime_env.pop("worker_process_setup_hook", None)
    return runtime_env


@pytest.fixture(scope="module")
def synced(ray_cluster):
    import raysleuth as rs
    from victims.weight_sync_job import Rollout, Trainer

    trainer = Trainer.options(runtime_env=_env(0)).remote()
    rollout = Rollout.options(runtime_env=_env(1)).remote()
    try:
        master = ray.get(trainer.prepare.remote(), timeout=180)
        ray.get([trainer.init_process_group.remote(rank=0, world_size=2, master=master),
                 rollout.init_process_group.remote(rank=1, world_size=2, master=master)], timeout=120)
        wrapped = ray.get(trainer.wrapped.remote())
        results = {}
        for step in range(BASE + 1, LAST + 1):
            ray.get(rollout.set_faults.remote(**FAULTS.get(step, {})))
            sent, got = ray.get([trainer.train_and_send.remote(step), rollout.receive.remote(step)], timeout=120)
            rs.logprob_gap(got["logprobs"], sent, step=step)
            results[step] = got
        from raysleuth.recorder import flush

        flush()
        from raysleuth.weights import weights_report

        def ours(report):
            mine = [s for s in report.syncs if s.version > BASE]
            return len(mine) >= LAST - BASE and all(s.sent for s in mine)

        report = poll(weights_report, ours, timeout=60)
        yield {"wrapped": wrapped, "results": results, "report": report}
    finally:
        for actor in (trainer, rollout):
            ray.kill(actor)


def _sync(synced, step):
    return next(s for s in synced["report"].syncs if s.version == step)


def test_the_engine_is_wrapped_with_no_change_to_the_trainer(synced):
    assert synced["wrapped"], "CheckpointEngineRegistry.new did not return a checked engine under the setup hook"


def test_twenty_healthy_syncs_raise_no_alarm(synced):
    for step in HEALTHY + [AFTER]:
        sync = _sync(synced, step)
        assert sync.status == "intact", (step, [d.describe() for d in sync.diffs], sync.notes)
        assert sync.sent == 27 and sync.received == [27]
        assert len(sync.loaded) == 2 and all(item["intact"] for item in sync.loaded)
    jumps = {jump["step"] for jump in synced["report"].jumps}
    assert not jumps & set(HEALTHY), jumps


def test_stale_sync_is_named_stale(synced):
    sync = _sync(synced, STALE)
    assert sync.status == "stale" and sync.stale
    assert all(d.stale for d in sync.diffs)


def test_corrupted_tensor_is_named_with_its_ranks(synced):
    sync = _sync(synced, CORRUPT)
    assert sync.status == "differs"
    [diff] = [d for d in sync.diffs if d.stage == "transit"]
    assert (diff.name, diff.kind, diff.sender_rank, diff.receiver_rank) == ("model.norm.weight", "value", 0, 1)
    assert diff.element_range == [0, 64]
    jump = next((j for j in synced["report"].jumps if j["step"] == CORRUPT), None)
    assert jump is not None and jump["sync"] == CORRUPT and "just before" in jump["verdict"]


def test_dropped_tensor_is_missing(synced):
    sync = _sync(synced, DROP)
    assert sync.missing == ["model.layers.0.mlp.up_proj.weight"] and sync.received == [26]


def test_bf16_engine_is_not_a_false_alarm(synced):
    sync = _sync(synced, CAST)
    assert sync.status == "intact", [d.describe() for d in sync.diffs]
    assert sync.casts, "the float32 -> bfloat16 cast went unreported"


def test_q_and_k_swapped_inside_qkv_proj_found_in_bf16(synced):
    sync = _sync(synced, CAST_SWAP)
    load = [d for d in sync.diffs if d.stage == "load"]
    names = {d.name for d in load}
    assert "model.layers.0.self_attn.q_proj.weight" in names and "model.layers.0.self_attn.k_proj.weight" in names
    assert any("swapped" in d.detail and d.name.endswith("q_proj.weight") for d in load)
    assert not [d for d in sync.diffs if d.stage == "transit"]


def test_one_tp_shard_missing(synced):
    sync = _sync(synced, SHARD)
    [diff] = [d for d in sync.diffs]
    assert (diff.name, diff.shard, diff.stage) == ("model.layers.1.mlp.down_proj.weight", 1, "load")


def test_cli_lines_and_exit_codes(synced, capsys):
    assert main(["weights", "--step", f"{HEALTHY[0]}-{HEALTHY[-1]}"]) == 0
    out = capsys.readouterr().out
    assert out.count("intact") >= 20 and "logprob gap" in out
    assert main(["weights", "--step", str(CORRUPT)]) == 1
    out = capsys.readouterr().out
    assert "first differing tensor: model.norm.weight" in out and "sender rank 0 -> receiver rank 1" in out
    assert main(["weights", "--step", "99999"]) == 2
    err = capsys.readouterr().err
    assert "no weight sync recorded at step 99999" in err and "Traceback" not in err
    assert main(["weights", "--json"]) == 1
