"""Weight-sync checks without Ray: the stream wrappers, the comparison, the load check, drift, the command.

Real torch tensors and a real transformers Qwen2 (random init, no download);
the store is a real SQLite file. The Ray path is ``test_weights_ray.py``.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

import raysleuth as rs
from raysleuth.errors import UsageError
from raysleuth.recorder.store import EvidenceStore, run_dir
from raysleuth.weights import (
    Gap, SideRecord, SyncSide, build_weights_report, compare_syncs, find_jumps,
)
from raysleuth.weights.stream import pass_through


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"layer.weight": torch.randn(300, 64, generator=generator), "layer.bias": torch.randn(64, generator=generator),
            "head.weight": torch.randn(16, 64, generator=generator)}


def _side(kind: str, version: int, items, *, rank: int = 0, shard=None, canonical=None) -> SideRecord:
    side = SyncSide(kind, version, shard=shard, canonical=canonical)
    for _ in pass_through(list(items), side):
        pass
    return SideRecord.from_data(dict(side.to_dict(True), rank=rank))


def _sync(sent, received, version=1, previous=None):
    sides = [_side("sent", version, sent.items(), rank=0), _side("received", version, received.items(), rank=1)]
    if previous is not None:
        sides.insert(0, _side("sent", version - 1, previous.items(), rank=0))
    return compare_syncs(sides)[-1]


# ------------------------------------------------------------------ the stream wrappers


def test_items_pass_through_unchanged_and_lazily():
    state = _state()
    seen = []

    def producer():
        for name, tensor in state.items():
            seen.append(name)
            yield name, tensor

    stream = rs.weights_sent(producer(), version=3)
    assert seen == []  # nothing read before the consumer asks
    first = next(stream)
    assert seen == ["layer.weight"] and first[1] is state["layer.weight"]
    rest = list(stream)
    assert [name for name, _ in rest] == ["layer.bias", "head.weight"] and rest[0][1] is state["layer.bias"]


def test_async_streams_pass_through():
    state = _state()

    async def producer():
        for item in state.items():
            yield item

    async def consume(side):
        return [item async for item in pass_through(producer(), side)]

    for kind in ("received", "sent"):  # the sent side awaits its digests off the loop's thread
        side = SyncSide(kind, 1)
        got = asyncio.run(consume(side))
        assert [t is state[n] for n, t in got] == [True, True, True]
        assert side.done and side.pending is None and [p.name for p in side.prints] == list(state)


def test_non_tensor_in_the_stream_is_one_clear_line():
    stream = rs.weights_sent([("layer.weight", torch.ones(2)), ("layer.bias", [1.0, 2.0])], version=1)
    next(stream)
    with pytest.raises(UsageError, match="'layer.bias' is not a tensor") as caught:
        next(stream)
    assert "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="not a \\(name, tensor\\) pair"):
        list(rs.weights_sent([torch.ones(2)], version=1))
    with pytest.raises(UsageError, match="version='5' is not an int"):
        rs.weights_sent([], version="5")


def test_a_zero_code_side_notes_a_bad_item_and_goes_on():
    side = SyncSide("received", 4, strict=False)
    items = [("a", torch.ones(3)), ("b", "not a tensor"), ("c", torch.zeros(2))]
    assert list(pass_through(items, side)) == items
    assert "'b' is not a tensor" in side.error and side.errors == 1 and [p.name for p in side.prints] == ["a", "c"]


def test_a_source_that_reuses_one_buffer_is_digested_before_it_refills_it():
    """The sent side digests off the caller's thread, but finishes before the source is asked for the next item.

    The source fills one buffer again for every item (as a bucketed engine does); the consumer copies each
    item (as a send would). Both sides must record exactly what each item held: an intact sync.
    """
    values = [torch.full((512, 1024), float(i)) for i in range(6)]

    def reusing():
        buffer = torch.empty(512, 1024)
        for i, value in enumerate(values):
            buffer.copy_(value)  # refilled only when the consumer asks for the next item
            yield f"w{i}", buffer

    sent, received = SyncSide("sent", 7), SyncSide("received", 7)
    copies = [(name, tensor.clone()) for name, tensor in pass_through(reusing(), sent)]
    assert sent.overlap and not received.overlap and sent.pending is None
    assert [tensor[0, 0].item() for _, tensor in copies] == [float(i) for i in range(6)]
    for _ in pass_through(reusing(), received):
        pass
    result = compare_syncs([SideRecord.from_data(dict(sent.to_dict(True), rank=0)),
                            SideRecord.from_data(dict(received.to_dict(True), rank=1))])[-1]
    assert result.intact and result.sent == 6
    assert len({p.digest for p in sent.prints}) == 6  # each print is of its own item, not of the last fill


# ------------------------------------------------------------------ sent vs received


def test_intact_sync_and_corrupted_tensor_with_element_range():
    sent = _state()
    assert _sync(sent, {k: v.clone() for k, v in sent.items()}).status == "intact"
    bad = {k: v.clone() for k, v in sent.items()}
    bad["layer.weight"].view(-1)[12345] += 1
    check = _sync(sent, bad)
    [diff] = check.diffs
    assert (check.status, diff.name, diff.kind, diff.sender_rank, diff.receiver_rank) == \
        ("differs", "layer.weight", "value", 0, 1)
    assert diff.element_range[0] <= 12345 < diff.element_range[1]
    assert "sender rank 0 -> receiver rank 1" in diff.describe()


def test_dropped_and_extra_tensors():
    sent = _state()
    received = {k: v for k, v in sent.items() if k != "layer.bias"}
    received["surprise.weight"] = torch.ones(2)
    check = _sync(sent, received)
    assert check.missing == ["layer.bias"] and check.extra == ["surprise.weight"] and check.received == [3]


def test_stale_sync_equals_the_previous_version():
    old, new = _state(0), _state(1)
    check = _sync(new, old, version=2, previous=old)
    assert check.status == "stale" and check.stale and all(d.stale for d in check.diffs)
    assert _sync(new, {**new, "layer.bias": torch.zeros(64)}, version=2, previous=old).status == "differs"


def test_dtype_and_shape_are_reported_as_such():
    sent = _state()
    check = _sync(sent, {**sent, "layer.bias": sent["layer.bias"].to(torch.bfloat16),
                         "head.weight": sent["head.weight"][:8]})
    kinds = {d.name: d.kind for d in check.diffs}
    assert kinds == {"layer.bias": "dtype", "head.weight": "shape"}
    assert "canonical='bfloat16'" in next(d.detail for d in check.diffs if d.kind == "dtype")


def test_canonical_cast_compares_at_the_lower_precision():
    sent = _state()
    cast = {k: v.to(torch.bfloat16) for k, v in sent.items()}
    sides = [_side("sent", 1, sent.items(), canonical="bfloat16"), _side("received", 1, cast.items(), rank=1)]
    check = compare_syncs(sides)[0]
    assert check.status == "intact" and len(check.casts) == 3  # only the precision differs: no alarm
    cast["layer.weight"].view(-1)[7] += 1
    sides[1] = _side("received", 1, cast.items(), rank=1)
    [diff] = compare_syncs(sides)[0].diffs
    assert diff.name == "layer.weight" and diff.kind == "value" and "after casting to bfloat16" in diff.detail


def test_a_missing_tensor_parallel_shard_in_the_stream():
    halves = {r: {k: v.chunk(2)[r] for k, v in _state().items()} for r in (0, 1)}
    sides = [_side("sent", 1, halves[r].items(), rank=r, shard=r) for r in (0, 1)]
    sides.append(_side("received", 1, halves[0].items(), rank=2, shard=0))
    check = compare_syncs(sides)[0]
    assert check.sent == 6 and sorted(check.missing) == [f"{k} [shard 1]" for k in sorted(halves[1])]
    assert {d.sender_rank for d in check.diffs} == {1}


def test_one_sided_syncs_are_not_intact():
    state = _state()
    [unreceived] = compare_syncs([_side("sent", 5, state.items())])
    [unsent] = compare_syncs([_side("received", 5, state.items())])
    assert (unreceived.status, unsent.status) == ("unreceived", "unsent")


# ------------------------------------------------------------------ what the engine loaded


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))


def _fused(model, faults=None, **kwargs):
    from victims.fused_engine import FusedQwen2

    engine = FusedQwen2(model.config, **kwargs)
    engine.faults = dict(faults or {})
    engine.by_name.pop("lm_head.weight")  # tied: the engine's lm_head is its embed_tokens
    return engine


def test_fused_layouts_tied_head_and_tp_slices_load_intact():
    model = _qwen2()
    for tp_rank in (0, 1):
        engine = _fused(model, tp_rank=tp_rank, tp_size=2)
        engine.load_weights(model.named_parameters())
        check = rs.check_weight_sync(model, engine, tp_rank=tp_rank, tp_size=2, record=False)
        assert check.intact, [d.describe() for d in check.diffs]
        assert check.checked == 26 and check.tied == ["lm_head.weight"]


def test_q_and_k_swapped_and_a_skipped_shard_are_named():
    model = _qwen2()
    engine = _fused(model, {"swap_qk": True}, dtype=torch.bfloat16)
    engine.load_weights(model.named_parameters())
    check = rs.check_weight_sync(model, engine, record=False)
    q = next(d for d in check.diffs if d.name == "model.layers.0.self_attn.q_proj.weight")
    assert "rows 0-64" in q.detail and "q_proj and k_proj swapped" in q.detail
    assert "compared at bfloat16" in q.detail
    shard = _fused(model, {"skip": "model.layers.1.mlp.up_proj.weight"}, tp_rank=1, tp_size=2)
    shard.load_weights(model.named_parameters())
    [diff] = rs.check_weight_sync(model, shard, tp_rank=1, tp_size=2, record=False).diffs
    assert (diff.name, diff.shard, diff.kind) == ("model.layers.1.mlp.up_proj.weight", 1, "value")
    assert "inside model.layers.1.mlp.gate_up_proj.weight rows 64-128" in diff.detail


def test_bf16_engine_is_not_a_false_alarm():
    model = _qwen2()
    engine = _fused(model, dtype=torch.bfloat16)
    engine.load_weights(model.named_parameters())
    check = rs.check_weight_sync(model, engine, record=False)
    assert check.intact and len(check.casts) == 26


def test_a_user_mapping_for_another_model():
    trainer = {"enc.w": torch.randn(4, 3), "enc.u": torch.randn(2, 3), "norm": torch.ones(3)}
    engine = {"fused_wu": torch.cat([trainer["enc.w"], trainer["enc.u"]]), "n": trainer["norm"].clone()}
    check = rs.check_weight_sync(trainer, engine, {"fused_wu": ["enc.w", "enc.u"], "n": "norm"}, record=False)
    assert check.intact and check.checked == 3
    with pytest.raises(UsageError, match="trainer parameter 'enc.v' .* does not have .*did you mean 'enc.w'"):
        rs.check_weight_sync(trainer, engine, {"fused_wu": ["enc.v", "enc.u"]}, record=False)
    with pytest.raises(UsageError, match="engine parameter 'nn'"):
        rs.check_weight_sync(trainer, engine, {"nn": "norm"}, record=False)
    with pytest.raises(UsageError, match="'n' is str, not a tensor"):
        rs.check_weight_sync(trainer, {"n": "x"}, record=False)


# ------------------------------------------------------------------ drift


def test_gap_jumps_point_at_the_sync_or_say_the_cause_is_elsewhere():
    gaps = [Gap(step=s, mean_abs=0.015, max_abs=0.1, tokens=10) for s in range(1, 9)]
    gaps[5].mean_abs = 0.201
    assert [g.step for g in find_jumps(gaps)] == [6]
    gap = rs.logprob_gap(torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-1.5, -2.0, -2.0]), step=3, record=False)
    assert (gap.mean_abs, gap.max_abs, gap.tokens) == (0.5, 1.0, 3)
    with pytest.raises(UsageError, match="3 rollout log probabilities, 2 trainer"):
        rs.logprob_gap([1, 2, 3], [1, 2], step=1, record=False)


# ------------------------------------------------------------------ the command, from a store


def _store(home, sides, gaps=()):
    path = run_dir(home, "run-w") / "evidence.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    store = EvidenceStore(path)
    for when, (kind, version, items, rank) in enumerate(sides):
        side = SyncSide(kind, version)
        for _ in pass_through(list(items), side):
            pass
        store.add("weight_sync", dict(side.to_dict(True), rank=rank), time=1000.0 + when, rank=rank, step=version,
                  name=kind)
    for step, mean in gaps:
        store.add("logprob_gap", {"step": step, "mean_abs": mean, "max_abs": mean * 3, "tokens": 8},
                  time=1000.0 + step, step=step, name="logprob_gap")
    store.close()
    (home / "runs" / "latest").write_text("run-w")
    return path


@pytest.fixture
def cli(capsys):
    from raysleuth.cli import main

    def run(*argv):
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_command_exit_codes_and_lines(tmp_path, cli):
    state = _state()
    sides = [(kind, v, state.items(), rank) for v in (1, 2, 3) for kind, rank in (("sent", 0), ("received", 1))]
    path = _store(tmp_path, sides, gaps=[(1, 0.01), (2, 0.012), (3, 0.011), (4, 0.2)])
    code, out, err = cli("weights", "--run", str(path))
    assert code == 1, out + err  # the jump at step 4
    assert "step 1: intact" in out and "logprob gap 0.01" in out
    assert "every sync up to step 4 is intact" in out and "cause is elsewhere" in out
    assert cli("weights", "--run", str(path), "--step", "1-2")[0] == 0
    code, out, err = cli("weights", "--run", str(path), "--json")
    data = json.loads(out)
    assert code == 1 and data["intact"] and data["problem"] and data["syncs"][0]["gap"]["mean_abs"] == 0.01
    code, out, err = cli("weights", "--run", str(path), "--step", "7")
    assert code == 2 and "no weight sync recorded at step 7" in err and "steps with a sync: 1-3" in err
    assert "Traceback" not in err


def test_a_broken_sync_is_pointed_at(tmp_path, cli):
    old, new = _state(0), _state(1)
    sides = [("sent", 1, old.items(), 0), ("received", 1, old.items(), 1),
             ("sent", 2, new.items(), 0), ("received", 2, old.items(), 1)]
    path = _store(tmp_path, sides, gaps=[(0, 0.01), (1, 0.012), (2, 0.3)])
    code, out, err = cli("weights", "--run", str(path))
    assert code == 1 and "step 2: stale" in out and "this sync did nothing" in out
    assert "the sync of version 2 just before it is stale" in out


def test_no_syncs_is_not_an_all_clear(tmp_path, cli):
    path = _store(tmp_path, [])
    code, out, err = cli("weights", "--run", str(path))
    assert code == 2 and "no weight syncs recorded" in out and "raysleuth run" in out


def test_bad_rows_are_skipped():
    class Row:
        kind, time, rank, pid = "weight_sync", 1.0, 0, 1

        def __init__(self, data):
            self.data = data

    report = build_weights_report([Row([1]), Row({"side": "sent", "version": "x"}), Row({"side": "sent", "version": 1,
                                                                                           "tensors": [{"name": 3}]})])
    assert report.skipped == 3 and report.syncs == []


def test_the_html_report_has_a_weights_section(tmp_path):
    from raysleuth.report import generate_report

    old, new = _state(0), _state(1)
    _store(tmp_path, [("sent", 1, old.items(), 0), ("received", 1, old.items(), 1),
                      ("sent", 2, new.items(), 0), ("received", 2, old.items(), 1)], gaps=[(1, 0.01), (2, 0.02)])
    result = generate_report(tmp_path / "r.html", run="run-w", home=tmp_path)
    text = result.path.read_text()
    assert result.sections["weights"] == 2
    assert 'id="weights"' in text and "STALE" in text and "INTACT" in text and "equals the previous version" in text


def test_verl_engines_are_checked_with_no_change(tmp_path):
    """verl's own colocated backend (a plain generator), created by CheckpointEngineRegistry.new, checked as is."""
    checkpoint_engine = pytest.importorskip("verl.checkpoint_engine")
    from raysleuth.weights import verl as verl_weights
    from raysleuth.recorder import RecordClient, StoreSink, reset_client

    store = EvidenceStore(tmp_path / "evidence.sqlite")
    client = RecordClient(StoreSink(store), run_id="verl-naive")
    old = reset_client(client)
    try:
        assert verl_weights.install()  # verl is imported already: the registry is wrapped at once
        engine = checkpoint_engine.CheckpointEngineRegistry.new("naive", bucket_size=1 << 20)
        assert isinstance(engine, checkpoint_engine.ColocatedCheckpointEngine)
        state = _state()
        engine.send_weights(iter(state.items()), global_steps=7)
        got = list(engine.receive_weights(global_steps=7))
        assert [(n, t is state[n]) for n, t in got] == [(n, True) for n in state]
        assert client.flush(10)
    finally:
        reset_client(old)
    report = build_weights_report(store.query("weight_sync"))
    [sync] = report.syncs
    assert (sync.version, sync.status, sync.sent, sync.received) == (7, "intact", 3, [3])
    assert {r.data["source"] for r in store.query("weight_sync")} == {"verl:ColocatedCheckpointEngine"}


def test_a_fused_parameter_missing_a_part_names_the_part():
    model = _qwen2()
    engine = _fused(model)
    engine.load_weights(model.named_parameters())
    state = {n: p for n, p in model.named_parameters(remove_duplicate=False) if "layers.0.mlp.up_proj" not in n}
    check = rs.check_weight_sync(state, engine, record=False)
    [diff] = check.diffs
    assert (diff.name, diff.kind) == ("model.layers.0.mlp.up_proj.weight", "missing")
    assert "gate_up_proj.weight is built from it" in diff.detail
