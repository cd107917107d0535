"""Rules other parts of raysleuth hand the verdict (``build_verdict(..., extra_rules=[...])``).

- :func:`stalled_ranks_rule`: the stall watchdog's evidence. Ranks whose heartbeat (``rs.step``, the
  collective count, a verl call that has not returned) made no progress for the stall time are named
  by the verdict itself, as strongly as collective positions, instead of being written into a verdict
  from outside.
"""

from __future__ import annotations

from typing import Any

from raysleuth.stacks.analysis import headline
from raysleuth.stacks.causes import make_culprit
from raysleuth.stacks.model import Culprit, ProcessStack

__all__ = ["stalled_ranks_rule"]


def stalled_ranks_rule(stalled: list[dict[str, Any]]):
    """A rule naming each stalled rank: ``stalled`` items carry rank, pid, node_ip and the reason in words
    (e.g. ``no heartbeat progress for 12s at step 3``). A rank whose process is not among those read is
    still named, with that said."""

    def heartbeat_stall(processes: list[ProcessStack], context: Any) -> list[Culprit]:
        culprits = []
        for item in stalled:
            pid, node_ip, rank = item.get("pid"), item.get("node_ip"), item.get("rank")
            process = next((p for p in processes if pid is not None and p.pid == pid
                            and (node_ip is None or p.node_ip == node_ip)), None)
            if process is None and pid is not None:
                process = next((p for p in processes if rank is not None and p.rank == rank), None)
            if process is None:
                culprits.append(Culprit(pid=pid or -1, node_ip=node_ip, rank=rank, rule="heartbeat stall",
                                        reason=f"{item['reason']}: its process was not found (exited?)"))
                continue
            culprit = make_culprit(process, f"{item['reason']}: {headline(process)}", "heartbeat stall")
            culprit.rank = rank if culprit.rank is None else culprit.rank
            culprits.append(culprit)
        return culprits

    return heartbeat_stall
