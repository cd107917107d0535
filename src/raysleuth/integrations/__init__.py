"""Integrations with trainers users already have.

- :mod:`raysleuth.integrations.verl` — instrument verl's ``RayWorkerGroup``
  (``pip install "raysleuth[verl]"``).
"""
