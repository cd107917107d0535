"""Victim: ranks that talk — through raysleuth's logger, and with plain ``print``.

``ChattyRank`` sets its rank, logs through ``rs.get_logger``, and prints
to stdout (output that only Ray's log files keep). Used by tests/test_logs.py
and bench/bench_logs.py.
"""

from __future__ import annotations


class ChattyRank:
    """One rank of a pretend training job."""

    def __init__(self, rank: int, world_size: int, logger_name: str = "victims.chatty") -> None:
        import raysleuth as rs

        rs.set_rank(rank, world_size)
        self.rank = rank
        self.log = rs.get_logger(logger_name)

    def train_step(self, step: int, loss: float, token: str = "") -> int:
        """Log one step's loss at INFO (tagged with the step)."""
        self.log.info("step %d loss=%.4f %s", step, loss, token, step=step)
        return self.rank

    def warn(self, message: str) -> None:
        """Log a warning."""
        self.log.warning(message)

    def log_with_rank(self, message: str, rank: int) -> None:
        """The seed articles' form: ``logger.info(msg, rank=...)``."""
        self.log.info(message, rank=rank)

    def shout(self, message: str) -> None:
        """Plain print: never goes through logging."""
        print(f"{message} from rank {self.rank}", flush=True)

    def settings(self) -> dict:
        """This worker's monitoring mode and log level."""
        from raysleuth import runtime

        current = runtime.settings()
        return {"mode": current.mode, "log_level": current.log_level}

    def flush(self) -> bool:
        """Deliver the queued evidence now."""
        from raysleuth.recorder import get_client

        return get_client().flush(timeout=20)
