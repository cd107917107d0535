"""Victim: data-parallel ranks that silently diverge.

Each ``DataParallelRank`` actor holds the same small torch model (same seed)
and can be made to diverge the ways real jobs do: one element of one
parameter perturbed, a parameter missing or reshaped or recast, a skipped
gradient all-reduce, a data file that differs. Every method that runs a
check calls the real raysleuth API inside the actor and returns the report
as a dict.
"""

from __future__ import annotations

import torch

import raysleuth as rs


class DataParallelRank:
    """One rank of a tiny data-parallel job (rank and world size set at start)."""

    def __init__(self, rank: int, world_size: int, seed: int = 0) -> None:
        rs.set_rank(rank, world_size)
        self.rank = rank
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        self.extra: dict[str, torch.Tensor] = {"buffer": torch.arange(100, dtype=torch.float32)}
        self.saved: dict = {}

    def rank_of(self) -> int:
        return self.rank

    def flush_evidence(self) -> bool:
        from raysleuth.recorder import get_client

        return get_client().flush(10)

    def perturb(self, name: str, index: tuple, delta: float) -> None:
        """Add ``delta`` to one element (``restore`` puts the exact old bits back)."""
        parameter = dict(self.model.named_parameters())[name]
        self.saved.setdefault((name, tuple(index)), parameter.detach()[index].clone())
        with torch.no_grad():
            parameter[index] += delta

    def restore(self) -> None:
        with torch.no_grad():
            for (name, index), value in self.saved.items():
                dict(self.model.named_parameters())[name][index] = value
        self.saved.clear()

    def tensors(self) -> dict:
        named = dict(self.model.named_parameters())
        named.update(self.extra)
        return named

    def set_extra(self, name: str, value) -> None:
        if value is None:
            self.extra.pop(name, None)
        else:
            self.extra[name] = value

    def check(self, key: str, timeout: float = 30, **options) -> dict:
        return rs.check_distributed_consistency(self.tensors(), key=key, timeout=timeout, **options).to_dict()

    def check_parameters(self, key: str, timeout: float = 30) -> dict:
        """The article's call: unnamed ``model.parameters()``."""
        return rs.check_distributed_consistency(self.model.parameters(), key=key, timeout=timeout).to_dict()

    def verify(self, tensors: dict, tolerance: float, name: str) -> dict:
        return rs.verify_distributed_tensors(tensor_dict=tensors, tolerance=tolerance, operation_name=name,
                                             timeout=30).to_dict()

    def train_step(self, world_size: int, skip_allreduce: bool = False) -> None:
        """Backward on this rank's shard, then a (simulated, exact) all-reduce: the mean of every shard's gradient.

        The all-reduce is computed locally from every rank's shard (same seeds),
        which is bitwise what a correct all-reduce would give on every rank.
        ``skip_allreduce`` keeps only this rank's local gradient: the bug.
        """
        generator = torch.Generator().manual_seed(1234)
        batches = [(torch.randn(16, 32, generator=generator), torch.randn(16, 8, generator=generator))
                   for _ in range(world_size)]
        self.model.zero_grad()
        if skip_allreduce:
            inputs, targets = batches[self.rank]
            torch.nn.functional.mse_loss(self.model(inputs), targets).backward()
            return
        for inputs, targets in batches:
            (torch.nn.functional.mse_loss(self.model(inputs), targets) / world_size).backward()

    def check_gradients(self, key: str) -> dict:
        return rs.check_gradient_sync(self.model.named_parameters(), key=key, timeout=30).to_dict()

    def check_data(self, path: str, indices: list, key: str) -> dict:
        return rs.check_data_consistency(dataset_path=path, sample_indices=indices, key=key, timeout=30).to_dict()

    def inspect(self, name: str, shard_dim=None) -> dict:
        if shard_dim is None:
            tensor = self.model[0].weight
        else:
            tensor = self.model[0].weight.chunk(4, dim=shard_dim)[self.rank]
        return rs.inspect_distributed_tensor(tensor, name, print_details=True, shard_dim=shard_dim,
                                             timeout=30).to_dict()

    def random_draws(self) -> list:
        import random

        import numpy as np

        return [random.random(), float(np.random.rand()), float(torch.rand(1))]
