"""Debug-aware worker pools, and instrumenting actors that already exist.

- :mod:`~raysleuth.pool.workers` — :class:`RayResourcePool` (ranked workers, ``debug_mode``);
- :mod:`~raysleuth.pool.allocator` — :class:`SmartResourceAllocator` (placement with a fallback);
- :mod:`~raysleuth.pool.instrument` — :func:`instrument` for running actors (through ``__ray_call__``).

Integrations with existing trainers live in :mod:`raysleuth.integrations`.
"""

from raysleuth.pool.allocator import AllocationPlan, Placement, SmartResourceAllocator, plan_placements
from raysleuth.pool.instrument import InstrumentOptions, InstrumentedWorker, install_here, instrument
from raysleuth.pool.workers import PoolWorker, RayResourcePool

WorkerGroup = RayResourcePool
"""DESIGN.md's name for a pool of instrumented, ranked workers (same class)."""

__all__ = [
    "AllocationPlan",
    "InstrumentOptions",
    "InstrumentedWorker",
    "Placement",
    "PoolWorker",
    "RayResourcePool",
    "SmartResourceAllocator",
    "WorkerGroup",
    "install_here",
    "instrument",
    "plan_placements",
]
