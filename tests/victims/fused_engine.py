"""A rollout engine's model with vLLM-style fused layouts, loaded the way vLLM's ``load_weights`` does.

The engine keeps Qwen2's weights under its own names: ``q_proj``/``k_proj``/
``v_proj`` stacked into ``qkv_proj`` (dim 0, each part sliced per
tensor-parallel rank), ``gate_proj``/``up_proj`` into ``gate_up_proj``,
``o_proj``/``down_proj`` sliced on dim 1, the rest whole. ``load_weights``
walks a stacked-params table: an HF name whose module is a stacked part goes
into its slot of the fused parameter, everything else is copied (and cast to
the engine's dtype) as it is. ``faults`` reproduce loader bugs: ``swap_qk``
(q and k written to each other's offsets), ``skip`` (one parameter never
written on this rank).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: (engine module, HF module, slot): how HF names are stacked into fused parameters.
STACKED = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
           ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]


class FusedQwen2(nn.Module):
    """The parameters of one tensor-parallel rank of a Qwen2 engine (no forward: it is loaded and checked)."""

    def __init__(self, config: Any, *, tp_rank: int = 0, tp_size: int = 1, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.tp_rank, self.tp_size, self.faults = tp_rank, tp_size, {}
        hidden, inter, head = config.hidden_size, config.intermediate_size, config.hidden_size // config.num_attention_heads
        self.q_size = config.num_attention_heads * head // tp_size
        self.kv_size = config.num_key_value_heads * head // tp_size
        self.inter = inter // tp_size

        def param(*shape):
            return nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=False)

        self.params = nn.ParameterDict()
        names = {"model.embed_tokens.weight": param(config.vocab_size // tp_size, hidden),
                 "model.norm.weight": param(hidden), "lm_head.weight": param(config.vocab_size // tp_size, hidden)}
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            names.update({
                p + "self_attn.qkv_proj.weight": param(self.q_size + 2 * self.kv_size, hidden),
                p + "self_attn.qkv_proj.bias": param(self.q_size + 2 * self.kv_size),
                p + "self_attn.o_proj.weight": param(hidden, hidden // tp_size),
                p + "mlp.gate_up_proj.weight": param(2 * self.inter, hidden),
                p + "mlp.down_proj.weight": param(hidden, self.inter),
                p + "input_layernorm.weight": param(hidden), p + "post_attention_layernorm.weight": param(hidden)})
        self.by_name = names
        for index, (name, value) in enumerate(names.items()):
            self.params[str(index)] = value

    def named_parameters(self, *args, **kwargs):  # the engine's own names, as vLLM's model reports them
        return iter(self.by_name.items())

    def _slot(self, slot: Any) -> tuple[int, int]:
        offsets = {"q": (0, self.q_size), "k": (self.q_size, self.kv_size),
                   "v": (self.q_size + self.kv_size, self.kv_size), 0: (0, self.inter), 1: (self.inter, self.inter)}
        if self.faults.get("swap_qk") and slot in ("q", "k"):
            return (0, self.kv_size) if slot == "k" else (self.kv_size, self.q_size)
        return offsets[slot]

    def _shard(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        size = tensor.shape[dim] // self.tp_size
        return tensor.narrow(dim, self.tp_rank * size, size)

    def load_weights(self, weights) -> set[str]:
        loaded = set()
        for name, tensor in weights:
            if self.faults.get("skip") == name:
                continue
            for engine_module, hf_module, slot in STACKED:
                if f".{hf_module}." not in name:
                    continue
                target = self.by_name[name.replace(hf_module, engine_module)]
                start, size = self._slot(slot)
                target.data.narrow(0, start, size).copy_(self._shard(tensor, 0))
                break
            else:
                target = self.by_name[name]
                if ".o_proj." in name or ".down_proj." in name:
                    target.data.copy_(self._shard(tensor, 1))
                elif "embed_tokens" in name or "lm_head" in name:
                    target.data.copy_(self._shard(tensor, 0))
                else:
                    target.data.copy_(tensor)
            loaded.add(name)
        return loaded
