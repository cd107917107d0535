"""Where the straggler is slow: its key thread's samples against its peers' (pure).

Input: py-spy's ``record --format raw --threads --full-filenames --idle``
text per process (one line per distinct stack: ``thread (TID): NAME;frame;
frame COUNT``, each frame ``function (file:line)``).

- **key thread**: the thread whose samples most often hold the job's own
  code (a frame outside the standard library, site-packages and
  raysleuth): a Ray actor's main thread, Ray Train's ``TrainingThread``.
- **location** of a sample: its innermost own-code frame, per function
  (the most sampled line names it).
- **slow phase**: the location where the straggler spends the largest
  share of its samples more than its peers do (their mean share); the
  peers' **wait**: the location where they spend more than the straggler
  (the line that enters the collective, e.g. ``loss.backward()``).
- **lead**: how far the slow phase's excess share (its share less its
  peers') stands above the closest alternative's (any other place, or no
  place at all), in standard errors of that difference (each process's
  samples a multinomial draw, shares smoothed by half a sample). A few
  samples a second cannot tell two places apart where the straggler spends
  similar extra time in both; a phase whose lead is under :data:`LEAD`, or
  drawn from fewer than :data:`MIN_SAMPLES` samples, is not *clear*: the
  caller samples again, and names no phase rather than the wrong one.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping

_THREAD = re.compile(r"^thread \((?P<tid>[^)]*)\)(?::\s*(?P<name>.*))?$")
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.*):(?P<line>\d+)\)$")
_LIBRARY = ("/site-packages/", "/dist-packages/", "<frozen ", "<string>")
_STDLIB = re.compile(r"/lib/python\d+\.\d+/")
LEAD = 2.0
"""Standard errors by which the slow phase must lead the closest alternative to be clear: over up to 6 rounds of 9
samples, a wrong phase about 1 time in 2,000 where the straggler's extra share is 0.60 in one place and 0.05 in
the next (``tests/test_stragglers_logic.py``)."""
MIN_SAMPLES = 5
"""Fewer of the straggler's own-code samples than this are never clear (the normal approximation fails)."""


def where(file: object, line: object) -> str:
    """``name.py:LINE``: a place as the output shows it (its file's name, not its path)."""
    return f"{str(file or '').rsplit('/', 1)[-1]}:{line}"


@dataclasses.dataclass
class Location:
    """One place in the job's code."""

    function: str
    file: str
    line: int

    @property
    def where(self) -> str:
        return where(self.file, self.line)


@dataclasses.dataclass
class ThreadSamples:
    """One thread's samples: each a stack (outermost first) and how often py-spy saw it."""

    tid: str
    name: str
    stacks: list[tuple[tuple[Location, ...], int]] = dataclasses.field(default_factory=list)

    @property
    def samples(self) -> int:
        return sum(count for _, count in self.stacks)


@dataclasses.dataclass
class SlowPhase:
    """Where the straggler spends the time its peers wait."""

    function: str
    file: str
    line: int
    share: float
    """Share of the straggler's key-thread samples there."""
    peer_share: float
    """Mean share of its peers' samples there."""
    stack: list[str]
    """The straggler's most sampled stack through that place, outermost first (``function (file:line)``)."""
    thread: str
    samples: int
    peer_samples: int
    peers_wait: dict[str, Any] | None = None
    """Where the peers spend their time instead: function, file, line, share, straggler_share."""
    lead: float | None = None
    """Its excess share's lead over the closest alternative's, in standard errors (None: not measured, a stored
    phase)."""
    runner_up: dict[str, Any] | None = None
    """The place it was least clearly told from (None: no place at all): function, file, line, share, peer_share."""

    @property
    def where(self) -> str:
        return where(self.file, self.line)

    @property
    def clear(self) -> bool:
        """True when its lead is at least :data:`LEAD` (or was not measured)."""
        return self.lead is None or self.lead >= LEAD


def own_code(location: Location, library_dirs: Iterable[str] = ()) -> bool:
    """True for the job's own code: not the standard library, site-packages, or ``library_dirs`` (raysleuth's)."""
    if any(part in location.file for part in _LIBRARY) or _STDLIB.search(location.file):
        return False
    return not any(location.file.startswith(prefix) for prefix in library_dirs if prefix)


def parse_raw(text: str) -> list[ThreadSamples]:
    """py-spy's raw (collapsed) output, per thread; unreadable lines are skipped."""
    threads: dict[str, ThreadSamples] = {}
    for line in (text or "").splitlines():
        stack_text, _, count_text = line.rstrip().rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        parts = stack_text.split(";")
        head = _THREAD.match(parts[0])
        tid, name = (head["tid"], head["name"] or "") if head else ("?", "")
        frames = []
        for part in parts[1:] if head else parts:
            found = _FRAME.match(part)
            if found:
                frames.append(Location(found["function"], found["file"], int(found["line"])))
        thread = threads.setdefault(tid, ThreadSamples(tid=tid, name=name))
        thread.stacks.append((tuple(frames), int(count_text)))
    return list(threads.values())


def key_thread(threads: Iterable[ThreadSamples], library_dirs: Iterable[str] = ()) -> ThreadSamples | None:
    """The thread that runs the job's own code most often."""
    library_dirs = tuple(library_dirs)

    def own(thread: ThreadSamples) -> int:
        return sum(count for frames, count in thread.stacks if any(own_code(f, library_dirs) for f in frames))

    best = max(threads, key=own, default=None)
    return best if best is not None and own(best) > 0 else None


def _locations(thread: ThreadSamples, library_dirs: tuple[str, ...]
               ) -> tuple[Counter, dict[tuple, Counter], dict[tuple, Counter]]:
    """Samples per own-code function (innermost), the lines seen in each, and the stacks through each."""
    counts: Counter = Counter()
    lines: dict[tuple, Counter] = defaultdict(Counter)
    stacks: dict[tuple, Counter] = defaultdict(Counter)
    for frames, count in thread.stacks:
        own = [f for f in frames if own_code(f, library_dirs)]
        if not own:
            continue
        inner = own[-1]
        key = (inner.file, inner.function)
        counts[key] += count
        lines[key][inner.line] += count
        stacks[key][tuple(f"{f.function} ({f.file}:{f.line})" for f in frames)] += count
    return counts, lines, stacks


def _smoothed(count: float, size: int) -> float:
    return (count + 0.5) / (size + 1)


def _variance(first: float, second: float | None, size: int) -> float:
    """The variance of one process's share at one place (``second`` None), or of its difference between two."""
    one = _smoothed(first, size)
    if second is None:
        return one * (1 - one) / size
    two = _smoothed(second, size)
    return (one * (1 - one) + two * (1 - two) + 2 * one * two) / size


def _lead(best: tuple, others: Iterable[tuple], counts: Counter, total: int, peers: list[tuple[Counter, int]],
          excess) -> tuple[float, tuple | None]:
    """How many standard errors ``best``'s excess share stands above the closest alternative's, and which.

    The alternatives: every other place (the difference of the two excesses, with its own variance: one
    process's shares at two places move against each other) and no place at all (an excess of 0).
    """
    if total < MIN_SAMPLES:
        return 0.0, None

    def z(gap: float, mine: float, theirs: float) -> float:
        return gap / math.sqrt(mine + (theirs / len(peers) ** 2 if peers else 0.0))

    lead = z(excess(best), _variance(counts[best], None, total),
             sum(_variance(seen.get(best, 0), None, size) for seen, size in peers))
    closest = None
    for other in others:
        pair = z(excess(best) - excess(other), _variance(counts[best], counts.get(other, 0), total),
                 sum(_variance(seen.get(best, 0), seen.get(other, 0), size) for seen, size in peers))
        if pair < lead:
            lead, closest = pair, other
    return lead, closest


def _place(key: tuple, lines: Mapping[tuple, Counter]) -> dict[str, Any]:
    return {"function": key[1], "file": key[0], "line": lines[key].most_common(1)[0][0]}


def slow_phase(straggler: Iterable[ThreadSamples], peers: Iterable[Iterable[ThreadSamples]],
               library_dirs: Iterable[str] = ()) -> SlowPhase | None:
    """The place where the straggler's key thread spends more of its samples than its peers' do, with its lead."""
    library_dirs = tuple(library_dirs)
    mine = key_thread(straggler, library_dirs)
    if mine is None:
        return None
    counts, lines, stacks = _locations(mine, library_dirs)
    total = sum(counts.values())
    peer_counts: list[tuple[Counter, int]] = []
    peer_lines: dict[tuple, Counter] = defaultdict(Counter)
    for threads in peers:
        thread = key_thread(threads, library_dirs)
        if thread is None:
            continue
        theirs, their_lines, _ = _locations(thread, library_dirs)
        size = sum(theirs.values())
        if size:
            peer_counts.append((theirs, size))
            for key, seen in their_lines.items():
                peer_lines[key].update(seen)
    if not total:
        return None

    def peer(key: tuple) -> float:
        return sum(seen.get(key, 0) / size for seen, size in peer_counts) / len(peer_counts) if peer_counts else 0.0

    def excess(key: tuple) -> float:
        return counts.get(key, 0) / total - peer(key)

    keys = list(dict.fromkeys(key for seen, _ in peer_counts for key in seen))  # in the order seen: ties go first-seen
    ranked = sorted(dict.fromkeys([*counts, *keys]), key=excess, reverse=True)
    best = next(key for key in ranked if key in counts)
    lead, runner = _lead(best, [key for key in ranked if key != best], counts, total, peer_counts, excess)
    phase = SlowPhase(function=best[1], file=best[0], line=lines[best].most_common(1)[0][0],
                      share=counts[best] / total, peer_share=peer(best),
                      stack=list(stacks[best].most_common(1)[0][0]), thread=mine.name or mine.tid,
                      samples=mine.samples, peer_samples=sum(size for _, size in peer_counts), lead=lead)
    if runner is not None:
        phase.runner_up = {**_place(runner, lines if runner in counts else peer_lines),
                           "share": counts.get(runner, 0) / total, "peer_share": peer(runner)}
    if keys:
        wait = max(keys, key=lambda key: -excess(key))
        if excess(wait) < 0:
            phase.peers_wait = {**_place(wait, peer_lines), "share": peer(wait),
                                "straggler_share": counts.get(wait, 0) / total}
    return phase
