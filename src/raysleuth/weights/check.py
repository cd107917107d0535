"""What the engine really loaded: :func:`check_weight_sync` compares an engine's parameters with the trainer's.

Both live in this process (a colocated engine, or the rollout worker right
after its load, holding what it received). Each engine parameter is cut back
into the trainer tensors it was built from (:mod:`.layouts`: fused
``qkv_proj``/``gate_up_proj``, a tied ``lm_head``, this rank's tensor-parallel
slice, or the user's mapping) and each part is compared bitwise, after a
canonical cast to the lower precision when the two are floats of different
precision. A part that holds another part's values is named so (``q_proj``
and ``k_proj`` swapped inside ``qkv_proj``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from raysleuth import runtime
from raysleuth.errors import UsageError
from raysleuth.fingerprints import chunk_bytes, first_difference, fingerprint
from raysleuth.weights.compare import TensorDiff
from raysleuth.weights.layouts import EMBED_NAME, Source, expected_parts, fused_parts, resolve
from raysleuth.weights.prints import cast_to, lower_precision
from raysleuth.weights.stream import KIND, next_version

__all__ = ["WeightCheck", "check_weight_sync"]


@dataclasses.dataclass(kw_only=True)
class WeightCheck:
    """The verdict on what one engine (one tensor-parallel rank of it) holds."""

    intact: bool
    checked: int
    """Trainer tensors compared (each part of a fused parameter counts once)."""
    version: int | None = None
    shard: int | None = None
    tp_size: int = 1
    diffs: list[TensorDiff] = dataclasses.field(default_factory=list)
    casts: list[str] = dataclasses.field(default_factory=list)
    """Tensors equal only after the canonical cast (e.g. float32 trainer, bfloat16 engine)."""
    tied: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dataclasses.asdict(self)


def _named(value: Any, side: str) -> dict[str, Any]:
    if hasattr(value, "named_parameters") and callable(value.named_parameters):
        return dict(value.named_parameters(remove_duplicate=False)) if side == "trainer" \
            else dict(value.named_parameters())
    if isinstance(value, Mapping):
        named = dict(value)
    elif isinstance(value, (list, tuple)) or hasattr(value, "__iter__"):
        named = dict(value)
    else:
        raise UsageError(f"check_weight_sync: the {side} is {type(value).__name__}",
                         fix="pass a torch module or a {name: tensor} state dict")
    for name, tensor in named.items():
        if not hasattr(tensor, "dtype") or not hasattr(tensor, "shape") or not hasattr(tensor, "narrow"):
            raise UsageError(f"check_weight_sync: {side} entry {name!r} is {type(tensor).__name__}, not a tensor",
                             fix="pass torch tensors")
    return named


def _same_tensor(left: Any, right: Any) -> bool:
    return left is right or (left.data_ptr() == right.data_ptr() and list(left.shape) == list(right.shape))


def _first_element(left: Any, right: Any, fp_left: Any, fp_right: Any) -> tuple[list[int] | None, int]:
    chunks = fp_left.differing_chunks(fp_right)
    if not chunks:
        return None, 0
    first = chunks[0]
    index = first_difference(chunk_bytes(left, fp_left, first), chunk_bytes(right, fp_right, first), fp_left.itemsize)
    start = first * fp_left.chunk_elems + (index or 0)
    return [start, fp_left.chunk_range(first)[1]], len(chunks)


def _compare_part(name: str, held: Any, expected: Any, where: str, shard: int | None) -> tuple[TensorDiff | None, bool]:
    """(a diff or None, whether only a cast separated them)."""
    if list(held.shape) != list(expected.shape):
        return TensorDiff(name=name, shard=shard, kind="shape", stage="load",
                          detail=f"engine holds {list(held.shape)}{where}, trainer has {list(expected.shape)}"), False
    cast = False
    if held.dtype != expected.dtype:
        a, b = str(held.dtype).removeprefix("torch."), str(expected.dtype).removeprefix("torch.")
        lower = lower_precision(a, b)
        if lower is None:
            return TensorDiff(name=name, shard=shard, kind="dtype", stage="load",
                              detail=f"engine holds {a}{where}, trainer has {b} (not a float cast)"), False
        held, expected, cast = cast_to(held, lower), cast_to(expected, lower), True
    held, expected = held.detach().contiguous(), expected.detach().contiguous()
    fp_held, fp_expected = fingerprint(held, algorithm="xxh3"), fingerprint(expected, algorithm="xxh3")
    if fp_held.same_as(fp_expected):
        return None, cast
    element_range, chunks = _first_element(held, expected, fp_held, fp_expected)
    at = f" (compared at {fp_held.dtype})" if cast else ""
    return TensorDiff(name=name, shard=shard, kind="value", stage="load", element_range=element_range,
                      differing_chunks=chunks, detail=f"engine's values differ{where}{at}"), cast


def _check_source(source: Source, engine: Any, parts: list[tuple[str, Any]], check: WeightCheck) -> None:
    shard = check.shard if check.tp_size > 1 else None
    rows = sum(int(part.shape[0]) if part.dim() else 1 for _, part in parts)
    fused = len(parts) > 1
    if fused and (engine.dim() == 0 or int(engine.shape[0]) != rows):
        check.diffs.append(TensorDiff(name=source.engine, shard=shard, kind="shape", stage="load",
                                      detail=f"engine holds {list(engine.shape)}, its parts {[n for n, _ in parts]} "
                                             f"make {rows} rows on dim 0"))
        return
    offset, offsets, differing = 0, {}, []
    for name, expected in parts:
        held = engine.narrow(0, offset, int(expected.shape[0])) if fused else engine
        where = f" inside {source.engine} rows {offset}-{offset + int(expected.shape[0])}" if fused else ""
        offsets[name] = offset
        offset += int(expected.shape[0]) if fused else 0
        diff, cast = _compare_part(name, held, expected, where, shard)
        check.checked += 1
        if cast:
            check.casts.append(name)
        if diff is not None:
            check.diffs.append(diff)
            differing.append((name, diff))
    if fused:
        _name_swaps(engine, differing, offsets, parts)
    if source.tied:
        check.tied.append(source.engine)


def _equal(left: Any, right: Any) -> bool:
    if list(left.shape) != list(right.shape):
        return False
    if left.dtype != right.dtype:
        lower = lower_precision(str(left.dtype).removeprefix("torch."), str(right.dtype).removeprefix("torch."))
        if lower is None:
            return False
        left, right = cast_to(left, lower), cast_to(right, lower)
    return fingerprint(left.contiguous(), algorithm="xxh3").same_as(fingerprint(right.contiguous(), algorithm="xxh3"))


def _name_swaps(engine: Any, differing: list, offsets: dict[str, int], parts: list[tuple[str, Any]]) -> None:
    """A part whose rows start with another part's values (q and k swapped inside qkv_proj): say which."""
    rows = int(engine.shape[0])
    for name, diff in differing:
        if diff.kind != "value":
            continue
        for other, expected in parts:
            size = int(expected.shape[0])
            if other != name and offsets[name] + size <= rows and _equal(engine.narrow(0, offsets[name], size), expected):
                mine, theirs = name.rsplit(".", 2)[-2], other.rsplit(".", 2)[-2]
                diff.detail += f"; its rows start with {other}'s values ({mine} and {theirs} swapped?)"
                break


def check_weight_sync(trainer_model_or_state: Any, engine_model_or_state: Any, mapping: Mapping[str, Any] | None = None,
                      *, tp_rank: int = 0, tp_size: int = 1, version: int | None = None,
                      record: bool = True) -> WeightCheck:
    """Compare what an engine holds with the trainer's weights, in this process; returns a :class:`WeightCheck`.

    ``mapping``: engine name -> trainer name(s), for layouts the built-in Llama/Qwen2 rules do not know.
    ``tp_rank``/``tp_size``: which tensor-parallel slice ``engine_model_or_state`` holds.
    ``version``: the sync this follows (the step); the result is recorded as the sync's ``loaded`` side,
    which ``raysleuth weights`` shows next to the stream's check. Raises :class:`UsageError` on bad input.
    """
    if not (isinstance(tp_size, int) and isinstance(tp_rank, int) and tp_size >= 1 and 0 <= tp_rank < tp_size):
        raise UsageError(f"check_weight_sync: tp_rank={tp_rank!r}, tp_size={tp_size!r}",
                         fix="pass 0 <= tp_rank < tp_size")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise UsageError(f"check_weight_sync: version={version!r} is not an int", fix="pass the trainer step")
    trainer, engine = _named(trainer_model_or_state, "trainer"), _named(engine_model_or_state, "engine")
    sources, unsourced, unheld = resolve(engine, trainer, mapping)
    check = WeightCheck(intact=True, checked=0, version=version, shard=tp_rank, tp_size=tp_size)
    for source in sources:
        _check_source(source, engine[source.engine], expected_parts(source, trainer, tp_rank=tp_rank,
                                                                    tp_size=tp_size), check)
    for name in unsourced:
        absent = [part for part in fused_parts(name) if part not in trainer]
        unheld = [part for part in unheld if not absent or part not in fused_parts(name)]  # not checkable
        for part in absent:
            check.diffs.append(TensorDiff(name=part, kind="missing", stage="load", shard=check.shard if tp_size > 1
                                          else None, detail=f"{name} is built from it, but the trainer side has none"))
        if not absent:
            check.diffs.append(TensorDiff(name=name, kind="extra", stage="load",
                                          detail="engine parameter built from no trainer tensor (pass mapping=)"))
    for name in unheld:
        if name == "lm_head.weight" and EMBED_NAME in trainer and _same_tensor(trainer[name], trainer[EMBED_NAME]):
            check.tied.append(name)  # the trainer ties it too: the engine's embed_tokens holds it
            continue
        check.diffs.append(TensorDiff(name=name, shard=tp_rank if tp_size > 1 else None, kind="missing",
                                      stage="load", detail="no engine parameter holds this trainer tensor"))
    check.intact = not check.diffs
    if record:
        _record(check)
    return check


def _record(check: WeightCheck) -> None:
    try:
        # the instruments here: rs.check_weight_sync and rs.weights_received, called in workers.
        # lazy: the instruments stay light to import: the recorder loads when a check is recorded
        from raysleuth.recorder import record

        if check.version is None:
            check.version = next_version("loaded")
        record(KIND, {"side": "loaded", "version": check.version, "shard": check.shard, "tp_size": check.tp_size,
                      "rank": runtime.get_rank(), "pid": os.getpid(), "source": "check_weight_sync",
                      "check": check.to_dict(), "tensors": []},
               name="loaded", step=check.version, level="INFO" if check.intact else "ERROR")
    except Exception:
        pass
