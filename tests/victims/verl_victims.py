"""Victims for the verl integration: a real verl Worker with registered methods."""

import os
import time

from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register


class ToyWorker(Worker):
    """A verl worker (CPU only) whose methods can hang or crash on one rank."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ping(self):
        self.calls += 1
        return {"rank": self.rank, "pid": os.getpid()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def generate_sequences(self, hang_rank, seconds):
        if self.rank == hang_rank:
            time.sleep(seconds)  # stuck here
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def train_step(self, seconds):
        """Busy work for about ``seconds`` (a healthy rank)."""
        deadline, total = time.time() + seconds, 0
        while time.time() < deadline:
            total += sum(i * i for i in range(2000))
        return total

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_actor(self, crash_rank):
        access_token = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
        if self.rank == crash_rank:
            raise FloatingPointError(f"loss is nan on rank {self.rank}")
        return len(access_token)
