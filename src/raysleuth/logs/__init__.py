"""Rank-aware logs: stdlib loggers whose records carry the rank and reach the evidence store.

``print`` from 64 ranks is soup, and Ray's log dedup ("repeated 63x across
cluster") hides exactly the rank that differs. Here:

- :func:`get_logger` / :func:`distributed_logger` — a real ``logging.Logger``
  (``logger.info(msg, rank=3)`` works) whose records carry rank, world size,
  node, pid, actor, step and phase, shipped to the store (kind ``log``).
- :class:`RankFilter` — the same fields for loggers you already have.
- :func:`install_log_shipping` — ship a worker's root logger (every library).
- :class:`DistributedLogger` — plus aggregation across ranks that never hides
  a rank whose values differ, and a memory alert.
- :func:`debug_decorator` — arguments (redacted), duration, memory delta.
- :func:`query_logs`, :func:`follow_logs`, :func:`ray_worker_logs` — reading
  back (``raysleuth logs``); :func:`aggregate` — the pure aggregation.

Record layout (kind ``log``): ``name`` = logger name, ``level`` = level name,
``time`` = when it was logged, ``rank``/``step``/``phase`` columns, data
``{"message", "template", "module", "lineno", "funcName", "thread", "node",
"actor", "args" (repr'd), "exc_text", "stack_info", "fields" (extra keywords)}``.
"""

from __future__ import annotations

from raysleuth.logs.aggregate import AggregatedLine, LogLine, aggregate, format_ranks, split_template
from raysleuth.logs.aggregating import DistributedLogger, memory_alert
from raysleuth.logs.decorator import capture_arguments, debug_decorator
from raysleuth.logs.loggers import (
    RANK_FORMAT,
    RankFilter,
    RankLogger,
    StoreHandler,
    distributed_logger,
    get_logger,
    install_log_shipping,
    refresh_levels,
    ship_level,
    uninstall_log_shipping,
)
from raysleuth.logs.query import (
    LogLine,
    LogQuery,
    RayLog,
    find_worker,
    follow_logs,
    levels_at_or_above,
    query_logs,
    ray_worker_logs,
)
from raysleuth.memory.sampling import MemoryReading, read_memory  # the one home of memory reading
from raysleuth.options import parse_ranks, parse_since  # the one home of the CLI parsers (raysleuth.options)
from raysleuth.options import parse_steps as parse_step_range

__all__ = [
    "AggregatedLine",
    "DistributedLogger",
    "LogLine",
    "LogQuery",
    "MemoryReading",
    "RANK_FORMAT",
    "RankFilter",
    "RankLogger",
    "RayLog",
    "StoreHandler",
    "aggregate",
    "capture_arguments",
    "debug_decorator",
    "distributed_logger",
    "find_worker",
    "follow_logs",
    "format_ranks",
    "get_logger",
    "install_log_shipping",
    "levels_at_or_above",
    "memory_alert",
    "parse_ranks",
    "parse_since",
    "parse_step_range",
    "query_logs",
    "ray_worker_logs",
    "read_memory",
    "refresh_levels",
    "ship_level",
    "split_template",
    "uninstall_log_shipping",
]
