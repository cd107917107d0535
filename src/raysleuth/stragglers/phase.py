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
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping

_THREAD = re.compile(r"^thread \((?P<tid>[^)]*)\)(?::\s*(?P<name>.*))?$")
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.*):(?P<line>\d+)\)$")
_LIBRARY = ("/site-packages/", "/dist-packages/", "<frozen ", "<string>")
_STDLIB = re.compile(r"/lib/python\d+\.\d+/")


@dataclasses.dataclass
class Location:
    """One place in the job's code."""

    function: str
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"


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

    @property
    def where(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"


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


def slow_phase(straggler: Iterable[ThreadSamples], peers: Iterable[Iterable[ThreadSamples]],
               library_dirs: Iterable[str] = ()) -> SlowPhase | None:
    """The place where the straggler's key thread spends more of its samples than its peers' do."""
    library_dirs = tuple(library_dirs)
    mine = key_thread(straggler, library_dirs)
    if mine is None:
        return None
    counts, lines, stacks = _locations(mine, library_dirs)
    total = sum(counts.values())
    peer_shares: list[Mapping[tuple, float]] = []
    peer_lines: dict[tuple, Counter] = defaultdict(Counter)
    peer_total = 0
    for threads in peers:
        thread = key_thread(threads, library_dirs)
        if thread is None:
            continue
        theirs, their_lines, _ = _locations(thread, library_dirs)
        size = sum(theirs.values())
        peer_total += size
        if size:
            peer_shares.append({key: value / size for key, value in theirs.items()})
            for key, seen in their_lines.items():
                peer_lines[key].update(seen)
    if not total:
        return None

    def peer(key: tuple) -> float:
        return sum(share.get(key, 0.0) for share in peer_shares) / len(peer_shares) if peer_shares else 0.0

    best = max(counts, key=lambda key: counts[key] / total - peer(key))
    phase = SlowPhase(function=best[1], file=best[0], line=lines[best].most_common(1)[0][0],
                      share=counts[best] / total, peer_share=peer(best),
                      stack=list(stacks[best].most_common(1)[0][0]), thread=mine.name or mine.tid,
                      samples=mine.samples, peer_samples=peer_total)
    keys = set().union(*peer_shares) if peer_shares else set()
    if keys:
        wait = max(keys, key=lambda key: peer(key) - counts.get(key, 0) / total)
        if peer(wait) > counts.get(wait, 0) / total:
            phase.peers_wait = {"function": wait[1], "file": wait[0], "line": peer_lines[wait].most_common(1)[0][0],
                                "share": peer(wait), "straggler_share": counts.get(wait, 0) / total}
    return phase
