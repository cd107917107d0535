"""A custom verl CheckpointEngine backend over gloo, as a user writes one (no raysleuth in it).

verl imports a job's own backend through ``checkpoint_engine.custom_backend_module``
and creates it with ``CheckpointEngineRegistry.new(backend, bucket_size=...)``.
This one moves each ``(name, tensor)`` from the trainer (rank 0) to the
rollout worker (rank 1) with two gloo broadcasts: the metadata, then the
bytes. ``faults`` reproduce the transport bugs the public reports describe:
``corrupt`` (one tensor damaged on the wire), ``drop`` (one tensor never
yielded), ``stale`` (the rollout side yields the previous sync's buffers).
"""

from __future__ import annotations

import socket
from typing import Any

import torch
import torch.distributed as dist
from verl.checkpoint_engine import CheckpointEngine, CheckpointEngineRegistry

BACKEND = "gloo_test"


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """Trainer -> rollout over a two-rank gloo group (rank 0 sends, rank 1 receives)."""

    def __init__(self, bucket_size: int, is_master: bool = False) -> None:
        self.bucket_size, self.is_master = bucket_size, is_master
        self.group_ready = False
        self.faults: dict[str, Any] = {}
        self.previous: dict[str, torch.Tensor] = {}

    def prepare(self) -> dict[str, Any]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return {"host": "127.0.0.1", "port": probe.getsockname()[1]}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        world = actor_wg_world_size + rollout_world_size
        master = metadata[0]
        actor = {"rank": list(range(actor_wg_world_size)), "world_size": [world] * actor_wg_world_size,
                 "master": [master] * actor_wg_world_size}
        rollout = {"rank": list(range(actor_wg_world_size, world)), "world_size": [world] * rollout_world_size,
                   "master": [master] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, master: dict) -> None:
        if not self.group_ready:
            dist.init_process_group("gloo", init_method=f"tcp://{master['host']}:{master['port']}",
                                    rank=rank, world_size=world_size)
            self.group_ready = True

    def finalize(self) -> None:
        pass  # the group is kept between syncs (a real backend may rebuild it)

    async def send_weights(self, weights, global_steps: int | None = None):
        async def each():
            if hasattr(weights, "__aiter__"):
                async for item in weights:
                    yield item
            else:
                for item in weights:
                    yield item

        async for name, tensor in each():
            dist.broadcast_object_list([(name, tuple(tensor.shape), str(tensor.dtype))], src=0)
            dist.broadcast(tensor.detach().contiguous(), src=0)
        dist.broadcast_object_list([None], src=0)

    async def receive_weights(self, global_steps: int | None = None):
        while True:
            meta = [None]
            dist.broadcast_object_list(meta, src=0)
            if meta[0] is None:
                return
            name, shape, dtype = meta[0]
            tensor = torch.empty(shape, dtype=getattr(torch, dtype.removeprefix("torch.")))
            dist.broadcast(tensor, src=0)
            if self.faults.get("corrupt") == name:
                tensor.view(-1)[tensor.numel() // 2] += 1.0  # one element damaged on the wire
            if self.faults.get("drop") == name:
                continue
            if self.faults.get("stale") and name in self.previous:
                tensor = self.previous[name]  # the bucket was never refreshed: last sync's values
            self.previous[name] = tensor.clone()
            yield name, tensor
