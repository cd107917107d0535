"""Who holds the bytes in a model, and its memory trend step by step.

- :func:`profile_memory_usage` — exact bytes per module: parameters,
  gradients, buffers and (given the optimizer) its state, each tensor
  counted once, attributed to the module that owns it directly, so the
  modules add up to the total. The seed's trend form
  ``profile_memory_usage(model, batch, interval=10, output_file=...)``
  returns a :class:`MemoryTrend`: call it once per step; every ``interval``
  steps it records a sample (store and JSON file).

Snapshots on demand are :mod:`.profiler`; peak-measured blocks are :mod:`.blocks`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from raysleuth.memory.sampling import read_sample
from raysleuth.memory.trend import LeakPolicy, LeakVerdict, detect_leak
from raysleuth.recorder import record

__all__ = ["MemoryProfile", "MemoryTrend", "ModuleMemory", "profile_memory_usage", "profile_model"]

log = logging.getLogger("raysleuth.memory")


@dataclasses.dataclass
class ModuleMemory:
    """Bytes one module owns directly (not its children's)."""

    name: str
    kind: str
    parameters_bytes: int = 0
    gradients_bytes: int = 0
    buffers_bytes: int = 0
    optimizer_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Everything this module holds."""
        return self.parameters_bytes + self.gradients_bytes + self.buffers_bytes + self.optimizer_bytes


@dataclasses.dataclass
class MemoryProfile:
    """A model's memory: totals and the top modules."""

    parameters_bytes: int
    gradients_bytes: int
    buffers_bytes: int
    optimizer_bytes: int
    total_bytes: int
    modules: list[ModuleMemory]
    """The ``top_n`` modules by total bytes."""
    module_count: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with each module's total."""
        result = dataclasses.asdict(self)
        for entry, module in zip(result["modules"], self.modules):
            entry["total_bytes"] = module.total_bytes
        return result


def _tensor_bytes(tensor) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


def _optimizer_state_bytes(optimizer, parameter) -> int:
    torch = sys.modules["torch"]
    state = optimizer.state.get(parameter, {}) if optimizer is not None else {}
    return sum(_tensor_bytes(v) for v in state.values() if isinstance(v, torch.Tensor))


def profile_model(model, top_n: int, optimizer) -> MemoryProfile:
    """Bytes per module of ``model`` (each tensor counted once, at its first owner); the ``top_n`` biggest."""
    seen: set[int] = set()
    modules = []
    for name, module in model.named_modules():
        entry = ModuleMemory(name=name or "(root)", kind=type(module).__name__)
        for parameter in module.parameters(recurse=False):
            if id(parameter) in seen:
                continue  # tied weights: counted once, at their first owner
            seen.add(id(parameter))
            entry.parameters_bytes += _tensor_bytes(parameter)
            if parameter.grad is not None:
                entry.gradients_bytes += _tensor_bytes(parameter.grad)
            entry.optimizer_bytes += _optimizer_state_bytes(optimizer, parameter)
        for buffer in module.buffers(recurse=False):
            if id(buffer) in seen:
                continue
            seen.add(id(buffer))
            entry.buffers_bytes += _tensor_bytes(buffer)
        modules.append(entry)
    totals = {field: sum(getattr(m, field) for m in modules)
              for field in ("parameters_bytes", "gradients_bytes", "buffers_bytes", "optimizer_bytes")}
    top = sorted((m for m in modules if m.total_bytes), key=lambda m: m.total_bytes, reverse=True)[:top_n]
    return MemoryProfile(total_bytes=sum(totals.values()), modules=top, module_count=len(modules), **totals)


def _batch_bytes(batch) -> int:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(batch, torch.Tensor):
        return _tensor_bytes(batch)
    if isinstance(batch, dict):
        return sum(_batch_bytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(_batch_bytes(v) for v in batch)
    nbytes = getattr(batch, "nbytes", None)
    return int(nbytes) if isinstance(nbytes, int) else 0


class MemoryTrend:
    """The seed's trend form: call once per step; every ``interval`` steps a sample is kept.

    Each kept sample (process memory plus the model's totals) is recorded as
    kind ``memory`` (``source: "profile"``) and the whole series is rewritten
    to ``output_file`` as JSON (``{"interval", "batch_bytes", "samples": [...],
    "leak": {...}}``).
    """

    def __init__(self, model, batch=None, *, interval: int = 10, output_file: str | Path | None = None,
                 optimizer=None) -> None:
        if interval < 1:
            raise ValueError(f"interval must be >= 1 step, got {interval!r}")
        self.model, self.optimizer = model, optimizer
        self.interval = int(interval)
        self.output_file = Path(output_file) if output_file else None
        self.batch_bytes = _batch_bytes(batch) if batch is not None else None
        self.samples: list[dict[str, Any]] = []
        self.calls = 0

    def __call__(self, step: int | None = None) -> dict[str, Any] | None:
        """Count one step; on every ``interval``-th, sample and return the sample."""
        self.calls += 1
        step = step if step is not None else self.calls
        if (self.calls - 1) % self.interval:
            return None
        try:
            sample = read_sample()
            sample.pop("cuda_devices", None)
            sample.update(time=time.time(), step=step)
            if self.model is not None:
                profile = profile_model(self.model, 0, self.optimizer)
                sample.update(model_parameters_bytes=profile.parameters_bytes,
                              model_gradients_bytes=profile.gradients_bytes,
                              model_optimizer_bytes=profile.optimizer_bytes)
            self.samples.append(sample)
            record("memory", {**{k: v for k, v in sample.items() if k not in ("time", "step")}, "source": "profile"},
                   step=step, time_=sample["time"])
            self._write()
            return sample
        except Exception as error:
            log.warning("raysleuth: memory trend sample failed: %r", error)
            return None

    step = __call__

    def leak(self, policy: LeakPolicy | None = None) -> LeakVerdict:
        """The leak verdict over the kept samples (host USS)."""
        return detect_leak([s["time"] for s in self.samples], [s.get("uss_bytes") for s in self.samples],
                           steps=[s["step"] for s in self.samples], policy=policy)

    def _write(self) -> None:
        if self.output_file is None:
            return
        payload = {"interval": self.interval, "batch_bytes": self.batch_bytes, "samples": self.samples,
                   "leak": self.leak().to_dict()}
        tmp = self.output_file.with_name(self.output_file.name + ".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        os.replace(tmp, self.output_file)


def profile_memory_usage(model, batch_or_top_n: Any = 10, *, top_n: int | None = None, optimizer=None,
                         interval: int | None = None, output_file: str | Path | None = None):
    """Exact per-module bytes of a torch model; or, with a batch/interval/output_file, a :class:`MemoryTrend`.

    ``profile_memory_usage(model, top_n=10, optimizer=opt)`` returns a
    :class:`MemoryProfile` now. ``profile_memory_usage(model, batch,
    interval=10, output_file="memory_profile.json")`` returns a
    :class:`MemoryTrend` to call once per step.
    """
    trend_form = interval is not None or output_file is not None or not isinstance(batch_or_top_n, int)
    if trend_form:
        batch = None if isinstance(batch_or_top_n, int) else batch_or_top_n
        return MemoryTrend(model, batch, interval=interval or 10, output_file=output_file, optimizer=optimizer)
    return profile_model(model, top_n if top_n is not None else batch_or_top_n, optimizer)
