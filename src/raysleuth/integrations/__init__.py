"""Integrations with trainers users already have.

- :mod:`raysleuth.integrations.verl` — instrument verl's ``RayWorkerGroup``
  (``pip install "raysleuth[verl]"``).

verl's weight syncs are checked by the weights feature itself
(:mod:`raysleuth.weights.verl`, installed by the zero-code worker setup).
"""
