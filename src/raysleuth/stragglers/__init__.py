"""Which rank is slow: fail-slow detection from collective enter times, with no code change (issue 26).

- :func:`find_stragglers` (:mod:`.analysis`, pure): per rank, its lateness
  into every collective (enter time minus the first enter of that
  collective), its share of the step, and the ranks that are late
  consistently (the rule and its thresholds are in :mod:`.analysis`).
  Takes plain per-rank call lists, so any source of enter times fits; the
  stacks verdict can call it.
- :func:`calls_from_records` (:mod:`.sources`, pure): those call lists from
  stored ``collectives`` records (the collective wrapper's calls, or torch's
  Flight Recorder entries); :func:`stragglers_from_records`: both at once,
  on records (what the stacks verdict calls).
- :func:`slow_phase` (:mod:`.phase`, pure): where the straggler spends the
  time its peers wait, from py-spy samples of both.
- :func:`collect_stragglers` (:mod:`.collect`): live (dump, judge, sample)
  or on a stored run. :class:`SlowWatch` (:mod:`.watching`): the check that
  ``raysleuth watch --slow`` repeats, recording ``straggler`` evidence.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Call", "SlowPhase", "SlowWatch", "Straggler", "StragglerReport", "calls_from_records",
           "collect_stragglers", "find_stragglers", "slow_phase", "stragglers_from_records"]

_HOMES = {
    "Call": "analysis", "Straggler": "analysis", "StragglerReport": "analysis", "find_stragglers": "analysis",
    "calls_from_records": "sources", "stragglers_from_records": "sources", "SlowPhase": "phase", "slow_phase": "phase",
    "collect_stragglers": "collect", "SlowWatch": "watching",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(f"raysleuth.stragglers.{home}"), name)
