"""Which trainer tensors each engine parameter was built from: fused layouts, tensor-parallel shards, a mapping.

An inference engine does not keep the trainer's names. vLLM's loaders for
the Llama/Qwen2 family stack ``q_proj``/``k_proj``/``v_proj`` into one
``qkv_proj`` (concatenated on dim 0) and ``gate_proj``/``up_proj`` into
``gate_up_proj``, and point ``lm_head`` at ``embed_tokens`` when the model
ties them. Under tensor parallelism each rank holds a slice: column-parallel
layers (``qkv_proj`` and ``gate_up_proj``, each part sliced on its own,
``embed_tokens``, ``lm_head``) on dim 0, row-parallel ones (``o_proj``,
``down_proj``) on dim 1, the rest whole.

:func:`resolve` turns the engine's names into :class:`Source` entries with
these rules; a user ``mapping`` takes their place for any other model:
``{"engine.name": "trainer.name"}``, ``{"engine.name": ["a", "b"]}`` (parts
concatenated on dim 0) or ``{"engine.name": {"sources": [...], "shard_dim": 1}}``.
Vocabulary padding and replicated KV heads (``tp_size`` above the KV head
count) are not modelled: map such parameters explicitly.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from raysleuth.errors import UsageError

__all__ = ["EMBED_NAME", "FUSED", "Source", "expected_parts", "fused_parts", "resolve"]

#: Fused engine module -> the trainer modules stacked into it on dim 0, in order.
FUSED: dict[str, tuple[str, ...]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_ROW_PARALLEL = ("o_proj", "down_proj")
_COLUMN_PARALLEL = ("qkv_proj", "gate_up_proj", "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj",
                    "embed_tokens", "lm_head")
EMBED_NAME = "model.embed_tokens.weight"


@dataclasses.dataclass(kw_only=True)
class Source:
    """One engine parameter and the trainer tensors it holds (concatenated on dim 0)."""

    engine: str
    parts: list[str]
    shard_dim: int | None = None
    """The dim each part is split on across tensor-parallel ranks; None: every rank holds it whole."""
    tied: bool = False
    """An ``lm_head`` the engine ties to ``embed_tokens``."""


def _module_of(name: str) -> str:
    pieces = name.split(".")
    return pieces[-2] if len(pieces) >= 2 else name


def _shard_dim(engine_name: str) -> int | None:
    module, leaf = _module_of(engine_name), engine_name.rsplit(".", 1)[-1]
    if module in _ROW_PARALLEL:
        return 1 if leaf == "weight" else None
    return 0 if module in _COLUMN_PARALLEL else None


def _near(name: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(names), n=2)
    return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""


def _from_mapping(engine_name: str, entry: Any, trainer: Mapping[str, Any]) -> Source:
    if isinstance(entry, str):
        parts, shard_dim = [entry], _shard_dim(engine_name)
    elif isinstance(entry, (list, tuple)):
        parts, shard_dim = list(entry), _shard_dim(engine_name)
    elif isinstance(entry, Mapping) and "sources" in entry:
        parts, shard_dim = list(entry["sources"]), entry.get("shard_dim")
    else:
        raise UsageError(f"mapping entry for engine parameter {engine_name!r} is {entry!r}",
                         fix="map it to a trainer name, a list of names (concatenated on dim 0) or "
                             "{'sources': [...], 'shard_dim': 0|1|None}")
    for part in parts:
        if not isinstance(part, str) or part not in trainer:
            raise UsageError(f"mapping names trainer parameter {part!r} for engine parameter {engine_name!r}, "
                             f"which the trainer does not have{_near(str(part), trainer)}",
                             fix="use a name from the trainer's named_parameters() / state_dict()")
    return Source(engine=engine_name, parts=parts, shard_dim=shard_dim)


def fused_parts(engine_name: str) -> list[str]:
    """The trainer names a fused engine parameter is stacked from (``[]`` when it is not fused)."""
    module = _module_of(engine_name)
    if module not in FUSED or engine_name.count(".") < 2:
        return []
    prefix, leaf = engine_name.rsplit(".", 2)[0], engine_name.rsplit(".", 1)[-1]
    return [f"{prefix}.{part}.{leaf}" for part in FUSED[module]]


def _rule(engine_name: str, trainer: Mapping[str, Any]) -> Source | None:
    if engine_name in trainer:
        return Source(engine=engine_name, parts=[engine_name], shard_dim=_shard_dim(engine_name))
    parts = fused_parts(engine_name)
    if parts:
        if all(part in trainer for part in parts):
            return Source(engine=engine_name, parts=parts, shard_dim=0)
    if engine_name == "lm_head.weight" and EMBED_NAME in trainer:
        return Source(engine=engine_name, parts=[EMBED_NAME], shard_dim=0, tied=True)
    return None


def resolve(engine_names: Iterable[str], trainer: Mapping[str, Any],
            mapping: Mapping[str, Any] | None = None) -> tuple[list[Source], list[str], list[str]]:
    """``(sources, engine names with no trainer source, trainer names no engine parameter holds)``.

    Raises :class:`UsageError` when ``mapping`` names a parameter either side lacks.
    """
    engine_names = list(engine_names)
    mapping = dict(mapping or {})
    unknown = [name for name in mapping if name not in engine_names]
    if unknown:
        raise UsageError(f"mapping names engine parameter {unknown[0]!r}, which the engine does not have"
                         f"{_near(unknown[0], engine_names)}", fix="use a name from the engine's named_parameters()")
    sources, unsourced = [], []
    for name in engine_names:
        source = _from_mapping(name, mapping[name], trainer) if name in mapping else _rule(name, trainer)
        if source is None:
            unsourced.append(name)
        else:
            sources.append(source)
    held = {part for source in sources for part in source.parts}
    return sources, unsourced, [name for name in trainer if name not in held]


def expected_parts(source: Source, trainer: Mapping[str, Any], *, tp_rank: int = 0,
                   tp_size: int = 1) -> list[tuple[str, Any]]:
    """``[(trainer name, the slice of it this tensor-parallel rank should hold)]``, in engine order."""
    parts = []
    for name in source.parts:
        tensor = trainer[name]
        if tp_size > 1 and source.shard_dim is not None and tensor.dim() > source.shard_dim:
            size = tensor.shape[source.shard_dim]
            if size % tp_size:
                raise UsageError(f"{name} has {size} rows on dim {source.shard_dim}, not divisible by tp_size={tp_size}",
                                 fix="map this parameter explicitly with shard_dim=None, or check tp_size")
            step = size // tp_size
            tensor = tensor.narrow(source.shard_dim, tp_rank * step, step)
        parts.append((name, tensor))
    return parts
