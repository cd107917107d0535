"""Integrations with trainers users already have.

- :mod:`raysleuth.integrations.verl` — instrument verl's ``RayWorkerGroup``
  (``pip install "raysleuth[verl]"``);
- :mod:`raysleuth.integrations.verl_weights` — check every weight sync of
  every verl ``CheckpointEngine`` (installed by the zero-code worker setup).
"""
