"""Who is which rank: one resolution for every process, live or dead.

Sources, most specific first, each named in ``rank_source``: raysleuth's own
registration, Ray Train's records, the process's start-up environment (read
from outside by the node agent), verl's worker names, and for dead actors
their creation ``runtime_env`` and the last labels the store saw.

``live`` resolves running processes (issue 19); ``dead`` resolves actors and
workers that are gone (issue 18). Features call these, never Ray directly.
"""

from __future__ import annotations

from raysleuth.labels.dead import dead_worker_labels
from raysleuth.labels.live import worker_labels

__all__ = ["dead_worker_labels", "worker_labels"]
