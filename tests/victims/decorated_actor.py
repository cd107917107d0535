"""Victim: an actor whose method carries ``@rs.debug_decorator`` (an instrument test), as a user writes it."""

import logging
import os
import warnings

import ray

import raysleuth as rs


@ray.remote(num_cpus=0)
class DecoratedWorker:
    def pid(self) -> int:
        return os.getpid()

    @rs.debug_decorator
    def train_step(self, batch, config):
        return sum(batch) * config.get("scale", 1)

    def ship_logs_and_warn(self) -> None:
        rs.install_log_shipping()  # every library's logging goes to the store now
        logging.getLogger("some.library").warning("library warning")
        warnings.warn("a library deprecation", DeprecationWarning, stacklevel=1)

    def flush(self) -> bool:
        from raysleuth.recorder import get_client

        return get_client().flush(30)
