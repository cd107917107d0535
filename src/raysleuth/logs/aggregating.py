"""``DistributedLogger``: a rank-aware logger that aggregates across ranks and alerts on memory.

:class:`DistributedLogger` delegates to :func:`~raysleuth.logs.get_logger`
and adds two helpers: every ``aggregation_interval`` seconds it can read the
run's new ``log`` records and print them aggregated across ranks (never
hiding a rank that differs), and a background sampler logs a WARNING (with
rank and phase) when this node's memory, or this process's GPU, passes
``alert_threshold`` of its capacity.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from raysleuth import runtime
from raysleuth.logs.aggregate import AggregatedLine, LogLine, aggregate
from raysleuth.logs.loggers import get_logger
from raysleuth.memory.sampling import MemoryReading, read_memory
from raysleuth.modes import mode_config
from raysleuth.recorder import get_client, open_store

__all__ = ["DistributedLogger", "memory_alert"]


def memory_alert(fractions: dict[str, float], threshold: float) -> str | None:
    """The alert text when a device's used fraction passes ``threshold``, else ``None``."""
    over = {device: used for device, used in fractions.items() if used >= threshold}
    if not over:
        return None
    parts = ", ".join(f"{device} {used:.0%}" for device, used in sorted(over.items()))
    return f"memory above {threshold:.0%} of capacity: {parts}"


class DistributedLogger:
    """A rank-aware logger with cross-rank aggregation and a memory alert.

    Use it like a stdlib logger (``.info(msg, rank=...)``, ``.warning``,
    ``.addHandler``...: every attribute comes from the underlying
    ``logging.Logger``, :attr:`logger`). On top:

    - :meth:`aggregated` returns the run's ``log`` records of this logger
      since the last call, aggregated across ranks (pure
      :func:`~raysleuth.logs.aggregate.aggregate`). :meth:`start_aggregation`
      prints them every ``aggregation_interval`` seconds through the
      ``<name>.aggregate`` logger (on the driver, where the store is read).
    - a daemon thread samples memory every ``memory_interval`` seconds
      (default: the mode's, 10 s light, 1 s full; none when off) and logs one
      WARNING with rank and phase when use passes ``alert_threshold`` of the
      node's (or GPU's) capacity; it re-arms when use falls back below.
    """

    def __init__(self, name: str | None = None, aggregation_interval: float = 10.0, alert_threshold: float = 0.9,
                 *, memory_interval: float | None = None, monitor_memory: bool = True, **options: Any) -> None:
        self.logger = get_logger(name, **options)
        self.name = self.logger.name
        self.aggregation_interval = float(aggregation_interval)
        self.alert_threshold = float(alert_threshold)
        self.alerts: list[str] = []
        self._last_id: int | None = None
        self._stop = threading.Event()
        self._alerting = False
        self._threads: list[threading.Thread] = []
        if memory_interval is None:
            try:
                memory_interval = mode_config(runtime.settings().mode).memory_interval_s
            except Exception:
                memory_interval = 10.0
        self.memory_interval = memory_interval
        if monitor_memory and memory_interval and runtime.settings().mode != "off":
            self._spawn(self._memory_loop, "raysleuth-memory-alert")

    # stdlib logger surface
    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.logger, attribute)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # ----------------------------------------------------------- memory

    def check_memory(self, reading: MemoryReading | None = None) -> str | None:
        """Sample memory now; log (once per crossing) and return the alert text, else ``None``."""
        try:
            reading = reading or read_memory()
            alert = memory_alert(reading.fractions(), self.alert_threshold)
            if alert is None:
                self._alerting = False
                return None
            if not self._alerting:
                self._alerting = True
                me = runtime.whoami()
                phase = runtime.current_phase()
                text = f"{alert} (rank {me.rank if me.rank is not None else '?'}, phase {phase or '-'}, " \
                       f"pid {me.pid}, rss {((reading.rss_bytes or 0) / 2**20):.0f} MiB)"
                self.alerts.append(text)
                self.logger.warning(text, memory_fractions=reading.fractions(),  # type: ignore[call-arg]
                                    alert="memory")  # a rank logger takes field keywords (logs.loggers)
            return alert
        except Exception:
            return None

    def _memory_loop(self) -> None:
        while not self._stop.wait(self.memory_interval):
            if runtime.settings().mode != "off":
                self.check_memory()

    # ------------------------------------------------------ aggregation

    def aggregated(self, *, run: str | None = None, home: Any = None, since: float | None = None,
                   all_loggers: bool = False) -> list[AggregatedLine]:
        """This logger's records (all loggers with ``all_loggers``) since the last call, aggregated."""
        store = open_store(run, home=home)
        try:
            records = store.query("log", after_id=self._last_id, since=since)
        finally:
            store.close()
        if records:
            self._last_id = records[-1].id if self._last_id is None else max(self._last_id, max(r.id for r in records))
        if not all_loggers:
            records = [r for r in records if r.name == self.name or (r.name or "").startswith(self.name + ".")]
        return aggregate(LogLine.from_record(r) for r in records)

    def start_aggregation(self, *, run: str | None = None, home: Any = None) -> None:
        """Print the aggregated lines every ``aggregation_interval`` s (``<name>.aggregate`` logger)."""
        output = logging.getLogger(f"{self.name}.aggregate")
        output.propagate = False
        if not output.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(message)s"))
            output.addHandler(handler)
        output.setLevel(logging.INFO)
        self._last_id = self._last_id or self._newest_id(run, home)

        def loop() -> None:
            while not self._stop.wait(self.aggregation_interval):
                try:
                    get_client().flush(timeout=2.0)
                    for line in self.aggregated(run=run, home=home):
                        output.log(logging.getLevelName(line.level) if isinstance(
                            logging.getLevelName(line.level), int) else logging.INFO,
                            line.text(), extra={"raysleuth_aggregate": True})
                except Exception:
                    pass

        self._spawn(loop, "raysleuth-log-aggregation")

    @staticmethod
    def _newest_id(run: str | None, home: Any) -> int | None:
        try:
            store = open_store(run, home=home)
            try:
                newest = store.query("log", newest_first=True, limit=1)
            finally:
                store.close()
            return newest[0].id if newest else None
        except Exception:
            return None

    def close(self) -> None:
        """Stop the background threads."""
        self._stop.set()
