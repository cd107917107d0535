"""The demo's training job: GRPO on a tiny policy, on CPU, as Ray actors.

The toy task: a prompt is a digit ``p`` (0..V-1); the policy writes
``LENGTH`` tokens and is rewarded for each token ``i`` equal to
``(p + i) % V``. GRPO: for each prompt the rollout worker samples a group
of completions, a reward/reference step scores them (reward, group-normalised
advantage, the reference policy's log-probabilities), and data-parallel
trainer ranks compute the clipped policy-gradient loss with a KL penalty on
their shard, exchange gradients through the object store (every rank reads
every rank's gradient refs and averages them), step Adam, and rank 0's
weights go back to the rollout worker.

The job uses raysleuth the way a user would, through ``import raysleuth as
rs`` only: ranks (``rs.set_rank`` and the ``RANK``/``WORLD_SIZE``
environment), ``rs.step``, spans, ``rs.get_logger``, ``rs.memory.watch``,
``rs.check_distributed_consistency`` and ``@rs.capture_crashes``. The
instruments catch their own failures, so the job never guards them.

Faults (:class:`Fault`) are injected here, one per scenario, on one rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from typing import Any

import raysleuth as rs

__all__ = ["Fault", "JobConfig", "RolloutWorker", "GRPOTrainer", "policy_weights", "score_group"]

VOCAB = 8
LENGTH = 4
HIDDEN = 32


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fault:
    """One fault to inject (``kind`` ``none`` for the healthy job)."""

    kind: str = "none"
    """``none``, ``hang``, ``diverge``, ``leak`` or ``crash``."""
    rank: int = 1
    """The trainer rank that misbehaves."""
    step: int = 2
    """The step at which it starts (hang, crash)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobConfig:
    """Size of the demo job."""

    name: str = "demo"
    """The scenario's name: keys its consistency checks apart from other scenarios'."""
    world_size: int = 3
    """Data-parallel trainer ranks (three, so that a majority can name an outlier)."""
    steps: int = 12
    prompts: int = 16
    group: int = 4
    seed: int = 0
    lr: float = 0.05
    kl_coef: float = 0.02
    clip: float = 0.2
    consistency_every: int = 2
    """Run ``check_distributed_consistency`` on the weights every N steps."""
    memory_interval: float = 0.1
    """Seconds between memory samples of each trainer rank."""


def build_policy(seed: int):
    """The tiny policy: (prompt digit, position) → logits over the vocabulary."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class TinyPolicy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.prompt = nn.Embedding(VOCAB, HIDDEN)
            self.position = nn.Embedding(LENGTH, HIDDEN)
            self.body = nn.Sequential(nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
            self.head = nn.Linear(HIDDEN, VOCAB)

        def forward(self, prompts):  # prompts: (N,) → logits (N, LENGTH, VOCAB)
            positions = torch.arange(LENGTH)
            hidden = self.prompt(prompts)[:, None, :] + self.position(positions)[None, :, :]
            return self.head(self.body(hidden))

    return TinyPolicy()


def _to_numpy(state: dict) -> dict:
    return {name: tensor.detach().cpu().numpy().copy() for name, tensor in state.items()}


def _from_numpy(policy, weights: dict) -> None:
    import torch

    policy.load_state_dict({name: torch.from_numpy(value) for name, value in weights.items()})


class RolloutWorker:
    """Samples completions from the current policy (no gradients)."""

    def __init__(self, seed: int) -> None:
        import torch

        self.policy = build_policy(seed)
        self.generator = torch.Generator().manual_seed(seed + 1000)
        self.log = rs.get_logger("raysleuth.demo.rollout")

    def generate(self, step: int, weights: dict | None, prompts: int, group: int) -> dict:
        """Sample ``group`` completions for each of ``prompts`` random prompts."""
        import torch

        with rs.span("rollout", step=step):
            if weights is not None:
                _from_numpy(self.policy, weights)
            prompt = torch.randint(0, VOCAB, (prompts,), generator=self.generator).repeat_interleave(group)
            with torch.no_grad():
                logits = self.policy(prompt)
                distribution = torch.distributions.Categorical(logits=logits)
                tokens = distribution.sample()
                logprobs = distribution.log_prob(tokens)
        return {"prompt": prompt.numpy(), "tokens": tokens.numpy(), "old_logprobs": logprobs.numpy(),
                "group": group, "step": step}


def score_group(batch: dict, reference_weights: dict, seed: int) -> dict:
    """Reward and reference step (a Ray task): rewards, group-normalised advantages, reference log-probs."""
    import numpy as np
    import torch

    with rs.span("score", step=batch["step"]):
        prompt = torch.from_numpy(batch["prompt"])
        tokens = torch.from_numpy(batch["tokens"])
        target = (prompt[:, None] + torch.arange(LENGTH)[None, :]) % VOCAB
        reward = (tokens == target).float().mean(dim=1)
        grouped = reward.view(-1, batch["group"])
        advantage = ((grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-4)).view(-1)
        reference = build_policy(seed)
        _from_numpy(reference, reference_weights)
        with torch.no_grad():
            ref_logprobs = torch.distributions.Categorical(logits=reference(prompt)).log_prob(tokens)
    return dict(batch, reward=reward.numpy(), advantage=advantage.numpy().astype(np.float32),
                ref_logprobs=ref_logprobs.numpy())


class GRPOTrainer:
    """One data-parallel trainer rank."""

    def __init__(self, rank: int, world_size: int, config: JobConfig, fault: Fault) -> None:
        import torch

        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)
        rs.set_rank(rank, world_size)
        self.rank, self.world_size, self.config, self.fault = rank, world_size, config, fault
        seed = config.seed + (7 if fault.kind == "diverge" and fault.rank == rank else 0)
        self.policy = build_policy(seed)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.lr)
        self.log = rs.get_logger("raysleuth.demo.trainer")
        self.kept_batches: list = []  # the leak fault keeps references here
        self.grads: list | None = None
        self.watcher: Any = None  # the memory sampler; False once it could not start
        self.log.info("trainer rank %d of %d ready (seed %d)", rank, world_size, seed)

    def _watch_memory(self) -> None:
        """Start ``rs.memory.watch`` once training runs (start-up growth is not a leak)."""
        if self.watcher is not None:
            return
        try:
            self.watcher = rs.memory.watch(interval=self.config.memory_interval)
        except Exception as error:  # the job runs on without a sampler
            self.watcher = False
            self.log.warning("memory watch unavailable: %s", error)

    def ready(self) -> dict:
        """Pid and rank, once the rank is set up."""
        return {"rank": self.rank, "pid": os.getpid()}

    def compute_grads(self, step: int, batch: dict) -> list:
        """Loss and gradients on this rank's shard of the scored batch."""
        import numpy as np
        import torch

        if step >= 1:
            self._watch_memory()
        with rs.step(step), rs.span("forward_backward", step=step):
            total = len(batch["prompt"])
            shard = slice(self.rank * total // self.world_size, (self.rank + 1) * total // self.world_size)
            prompt = torch.from_numpy(batch["prompt"][shard])
            tokens = torch.from_numpy(batch["tokens"][shard])
            advantage = torch.from_numpy(batch["advantage"][shard])
            old = torch.from_numpy(batch["old_logprobs"][shard])
            ref = torch.from_numpy(batch["ref_logprobs"][shard])
            logprobs = torch.distributions.Categorical(logits=self.policy(prompt)).log_prob(tokens)
            ratio = torch.exp(logprobs - old)
            clipped = torch.clamp(ratio, 1 - self.config.clip, 1 + self.config.clip)
            surrogate = torch.minimum(ratio * advantage[:, None], clipped * advantage[:, None])
            kl = torch.exp(ref - logprobs) - (ref - logprobs) - 1
            loss = -(surrogate - self.config.kl_coef * kl).mean()
            self.optimizer.zero_grad()
            loss.backward()
            if self.fault.kind == "leak" and self.fault.rank == self.rank:
                # The bug: every batch (and a big activation buffer) stays referenced forever.
                self.kept_batches.append((batch, np.ones(3_000_000, dtype=np.float32)))
            grads = [p.grad.detach().numpy().copy() for p in self.policy.parameters()]
            if self.fault.kind == "hang" and self.fault.rank == self.rank and step >= self.fault.step:
                self._wait_for_gradient_bucket()
            if step % 4 == 0:
                self.log.info("step %d loss %.4f reward %.3f", step, float(loss), float(batch["reward"].mean()))
            return grads

    def _wait_for_gradient_bucket(self) -> None:
        """The hang fault: waits for an event that nobody will ever set."""
        self.log.warning("rank %d waiting for its gradient bucket", self.rank)
        never = threading.Event()
        while not never.wait(0.5):
            pass

    @rs.capture_crashes
    def update(self, step: int, grad_refs: list) -> dict:
        """Exchange gradients through the object store, average them, step the optimizer."""
        import ray
        import torch

        with rs.step(step):
            with rs.span("exchange", step=step):
                everyone = ray.get(list(grad_refs))
            if self.fault.kind == "crash" and self.fault.rank == self.rank and step >= self.fault.step:
                scale = everyone[0][0]
                raise ValueError(f"gradient scale became NaN at step {step} (loss scale {float(scale.sum()):.3f}): "
                                 "refusing to apply the update")
            with rs.span("optimizer", step=step):
                for index, param in enumerate(self.policy.parameters()):
                    param.grad = torch.from_numpy(sum(grads[index] for grads in everyone) / len(everyone))
                self.optimizer.step()
            result: dict[str, Any] = {"rank": self.rank, "step": step}
            if self.config.consistency_every and step % self.config.consistency_every == 0:
                result["consistency"] = self.check_weights(step)
        return result

    def check_weights(self, step: int) -> dict | None:
        """Every rank compares its weights with the others' (``rs.check_distributed_consistency``)."""
        with rs.span("consistency", step=step):
            try:
                report = rs.check_distributed_consistency(
                    dict(self.policy.named_parameters()), key=f"{self.config.name}/policy-weights", step=step, timeout=30.0)
            except Exception as error:
                self.log.warning("consistency check failed to run: %s", error)
                return None
        if not getattr(report, "consistent", True):
            self.log.error("weights differ across ranks at step %d", step)
        return {"consistent": bool(getattr(report, "consistent", True))}

    def weights(self) -> dict:
        """This rank's weights as numpy arrays (for the rollout worker and the reference)."""
        return _to_numpy(self.policy.state_dict())

    def memory_mb(self) -> float:
        """This process's RSS in MiB."""
        import psutil

        return psutil.Process().memory_info().rss / 2**20

    def stop(self) -> None:
        """Stop the memory sampler and flush evidence before the actor is killed."""
        watcher = self.watcher
        with contextlib.suppress(Exception):
            if watcher and hasattr(watcher, "stop"):
                watcher.stop()
        rs.flush(5.0)


def now() -> float:
    """Wall-clock time (one place, for the runner)."""
    return time.time()


def policy_weights(trainer: GRPOTrainer) -> dict:
    """The trainer's named parameters (what ``rs.compare`` runs on each trainer actor)."""
    return {name: param.detach() for name, param in trainer.policy.named_parameters()}
