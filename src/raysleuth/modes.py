"""The monitoring modes, in one place: ``off``, ``light`` (cheap, always on), ``full`` (everything).

:data:`MODES` names them (``RAYSLEUTH_MODE`` picks one, see
:class:`raysleuth.runtime.Settings`); :func:`mode_config` says what each
turns on, for the instruments to read:

====================  ==========  =============  ===========
                      off         light          full
====================  ==========  =============  ===========
log_level (shipped)   (none)      WARNING        INFO
memory_interval_s     none        10 s           1 s
spans                 off         phase          all
heartbeats            no          yes            yes
detailed_tracing      no          no             yes
====================  ==========  =============  ===========

Pure: which mode is in force lives in the settings; switching it is
:mod:`raysleuth.monitoring`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth.errors import UsageError

__all__ = ["MODES", "ModeConfig", "mode_config", "read_mode"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModeConfig:
    """What one monitoring mode turns on (read by every instrument)."""

    mode: str
    """``off``, ``light`` or ``full``."""
    log_level: str | None
    """Lowest level shipped to the store (``None``: nothing is shipped)."""
    memory_interval_s: float | None
    """Seconds between memory samples (``None``: no sampling)."""
    spans: str
    """``off``, ``phase`` (spans the user opened: training phases) or ``all`` (every instrumented call too)."""
    heartbeats: bool
    """Heartbeats are recorded."""
    detailed_tracing: bool
    """Every Ray task and actor call is traced (``enable_detailed_tracing``)."""
    capture_args: bool
    """``debug_decorator`` and tracing keep (redacted) call arguments."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


_CONFIGS = {
    "off": ModeConfig(mode="off", log_level=None, memory_interval_s=None, spans="off", heartbeats=False,
                      detailed_tracing=False, capture_args=False),
    "light": ModeConfig(mode="light", log_level="WARNING", memory_interval_s=10.0, spans="phase", heartbeats=True,
                        detailed_tracing=False, capture_args=False),
    "full": ModeConfig(mode="full", log_level="INFO", memory_interval_s=1.0, spans="all", heartbeats=True,
                       detailed_tracing=True, capture_args=True),
}
MODES = tuple(_CONFIGS)


def mode_config(mode: str) -> ModeConfig:
    """What ``mode`` turns on; :class:`~raysleuth.errors.UsageError` for a mode that is not one of :data:`MODES`."""
    try:
        return _CONFIGS[mode]
    except KeyError:
        raise UsageError(f"monitoring mode {mode!r} is unknown", fix="use off, light or full") from None


def read_mode(value: str | None) -> tuple[str, str | None]:
    """The mode ``RAYSLEUTH_MODE=value`` names (unset: ``light``), and a warning when it names none (then ``light``)."""
    mode = (value or "light").strip().lower()
    if mode in MODES:
        return mode, None
    return "light", f"RAYSLEUTH_MODE={mode!r} is not one of {', '.join(MODES)}; using 'light'"
