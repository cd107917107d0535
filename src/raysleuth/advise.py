"""What to run, in order: the debugging decision tree as data.

:func:`advise` turns a few answers (the kind of problem, the number of
nodes, whether it reproduces) into the raysleuth commands and instruments
to use, each with why. The tree lives in ``raysleuth/data/advice.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources
from typing import Any

from raysleuth.deaths.classify import CAUSES
from raysleuth.errors import UsageError

__all__ = ["PROBLEMS", "Advice", "Step", "advise", "get_advice"]


@functools.lru_cache(maxsize=1)
def _tree() -> dict[str, Any]:
    return json.loads(resources.files("raysleuth").joinpath("data/advice.json").read_text(encoding="utf-8"))


PROBLEMS: tuple[str, ...] = ("hang", "divergence", "memory", "crash", "scheduling", "slow")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """One thing to do: a command (``cli``), a line of code (``code``) or a variable (``env``)."""

    order: int
    kind: str
    run: str
    why: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Advice:
    """The steps for one problem, in the order to take them."""

    problem: str
    summary: str
    nodes: int | None
    reproducible: bool | None
    steps: list[Step]
    causes: list[str] = dataclasses.field(default_factory=list)
    """The classified death causes the steps were chosen for (:data:`raysleuth.deaths.CAUSES`)."""

    def to_dict(self) -> dict[str, Any]:
        """The advice as a JSON-ready dict."""
        return dataclasses.asdict(self)


def advise(problem: str, *, nodes: int | None = None, reproducible: bool | None = None,
           cause: str | list[str] | None = None) -> Advice:
    """The steps for ``problem`` (one of :data:`PROBLEMS`), filtered by cluster size and reproducibility.

    ``cause``: the classified cause(s) of a worker death (``raysleuth tasks --dead``: ``fatal_signal``,
    ``oom_killer``, ``memory_monitor``, ``sigkill``...); steps written for other causes are left out, and
    without one, every cause-specific step is.
    """

    causes = [cause] if isinstance(cause, str) else list(cause or [])
    unknown = [item for item in causes if item not in CAUSES]
    if unknown:
        raise UsageError(f"unknown cause {unknown[0]!r}", fix=f"use one of: {', '.join(CAUSES)}")
    tree = _tree()["problems"]
    key = (problem or "").strip().lower()
    if key not in tree:
        raise UsageError(f"unknown problem {problem!r}", fix=f"use one of: {', '.join(sorted(tree))}")
    if nodes is not None and nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {nodes}")
    steps: list[Step] = []
    for item in tree[key]["steps"]:
        if nodes is not None and nodes < item.get("min_nodes", 1):
            continue
        if nodes is not None and "max_nodes" in item and nodes > item["max_nodes"]:
            continue
        if "causes" in item and not set(item["causes"]) & set(causes):
            continue
        wanted = item.get("reproducible")
        if wanted is not None and reproducible is not None and wanted != reproducible:
            continue
        steps.append(Step(order=len(steps) + 1, kind=item["kind"], run=item["run"], why=item["why"]))
    return Advice(problem=key, summary=tree[key]["summary"], nodes=nodes, reproducible=reproducible, steps=steps,
                  causes=causes)


#: ``rs.get_advice``: the public API name of :func:`advise` (``rs.advise`` is this module).
get_advice = advise
