"""An RL-style job's two halves as Ray actors: a trainer that trains and sends, a rollout worker that loads.

Both create their verl CheckpointEngine the way verl's workers do: import the
job's ``custom_backend_module``, then ``CheckpointEngineRegistry.new``. The
trainer has no raysleuth in it: under the zero-code setup its engine's
``send_weights`` is checked by raysleuth itself. The rollout worker calls two
raysleuth instruments after each load (this file's subject is them):
``rs.check_weight_sync`` on what its engine holds; the driver, holding both sides' log probabilities as
verl's does, calls ``rs.logprob_gap``.
"""

from __future__ import annotations

import asyncio
import os

import ray
import torch

CUSTOM_BACKEND_MODULE = "victims.gloo_checkpoint_engine"
TP_SIZE = 2


def tiny_config():
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2)


def new_engine():
    from verl.checkpoint_engine import CheckpointEngineRegistry
    from verl.utils.import_utils import import_external_libs

    import_external_libs(CUSTOM_BACKEND_MODULE)
    from victims.gloo_checkpoint_engine import BACKEND

    return CheckpointEngineRegistry.new(BACKEND, bucket_size=1 << 20)


BATCH = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))


def token_logprobs(model) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=BATCH).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, BATCH[:, 1:, None]).squeeze(-1)


@ray.remote(num_cpus=0.5)
class Trainer:
    """Trains a tiny Qwen2 one step per sync and sends its weights through the engine."""

    def __init__(self):
        from transformers import Qwen2ForCausalLM

        torch.manual_seed(0)
        self.model = Qwen2ForCausalLM(tiny_config())
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-2)
        self.engine = new_engine()

    def prepare(self):
        return self.engine.prepare()

    def init_process_group(self, **kwargs):
        self.engine.init_process_group(**kwargs)

    def wrapped(self) -> bool:
        return bool(getattr(self.engine, "__raysleuth_weights__", False))

    def train_and_send(self, step: int):
        loss = self.model(input_ids=BATCH, labels=BATCH).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        asyncio.run(self.engine.send_weights(((n, p.detach()) for n, p in self.model.named_parameters()),
                                             global_steps=step))
        return token_logprobs(self.model).tolist()


@ray.remote(num_cpus=0.5)
class Rollout:
    """Receives through the engine, loads into a fused engine model per tensor-parallel rank, checks the load."""

    def __init__(self):
        from transformers import Qwen2ForCausalLM
        from victims.fused_engine import FusedQwen2

        self.engine = new_engine()
        self.config = tiny_config()
        self.shards = [FusedQwen2(self.config, tp_rank=r, tp_size=TP_SIZE) for r in range(TP_SIZE)]
        self.scorer = Qwen2ForCausalLM(self.config)
        self.checks = []

    def prepare(self):
        return self.engine.prepare()

    def init_process_group(self, **kwargs):
        self.engine.init_process_group(**kwargs)

    def set_faults(self, transport=None, loader=None, shard=None, dtype=None):
        from victims.fused_engine import FusedQwen2

        self.engine.faults = dict(transport or {})
        dtype = getattr(torch, dtype) if dtype else torch.float32
        self.shards = [FusedQwen2(self.config, tp_rank=r, tp_size=TP_SIZE, dtype=dtype) for r in range(TP_SIZE)]
        for index, engine in enumerate(self.shards):
            engine.faults = dict(loader or {}) if shard in (None, index) else {}

    def receive(self, step: int):
        import raysleuth as rs

        async def take():
            return [(name, tensor) async for name, tensor in self.engine.receive_weights(global_steps=step)]

        received = dict(asyncio.run(take()))
        for engine in self.shards:
            engine.load_weights(received.items())
        results = [rs.check_weight_sync(received, engine, tp_rank=engine.tp_rank, tp_size=TP_SIZE, version=step)
                   for engine in self.shards]
        self.scorer.load_state_dict(received, strict=False)
        from raysleuth.recorder import flush

        flush()
        return {"pid": os.getpid(), "intact": [r.intact for r in results], "logprobs": token_logprobs(self.scorer).tolist(),
                "diffs": [d.describe() for r in results for d in r.diffs]}

    def flush(self):
        from raysleuth.recorder import flush

        flush()
