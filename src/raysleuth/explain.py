"""What does this error mean? Cause and fix for the failures Ray training hits.

:func:`explain` matches text (an exception, a traceback, a whole log) against
a knowledge base kept as data (``raysleuth/data/knowledge.json``): each entry
has patterns, a cause and a fix, and a *depth* that places it in Ray's
causality chain. A ``RayTaskError`` wrapping an ``ActorDiedError`` wrapping a
memory-monitor OOM kill matches all three; the OOM kill (deepest) comes
first, because it is the root cause. Among entries of equal depth the one
seen later in the text (the innermost exception of a chained traceback)
comes first.

Pure logic: no Ray, no I/O besides reading the knowledge base once.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import traceback
from importlib import resources
from typing import Any

__all__ = ["KnowledgeEntry", "Match", "WRAPPER", "explain", "explain_error", "explain_exception",
           "innermost_exception", "knowledge_base", "mentioned_workers"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: Longest text scanned in full; longer text keeps its head and (mostly) its tail, where errors end up.
_MAX_TEXT = 8_000_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class KnowledgeEntry:
    """One known failure: how to recognise it, why it happens, what to do."""

    id: str
    title: str
    depth: int
    """Place in the causality chain: higher is closer to the root cause."""
    patterns: tuple[str, ...]
    cause: str
    fix: str
    docs: str | None = None
    case_sensitive: bool = False

    @functools.cached_property
    def regex(self) -> re.Pattern[str]:
        """All patterns as one compiled alternation."""
        flags = 0 if self.case_sensitive else re.IGNORECASE
        return re.compile("|".join(f"(?:{pattern})" for pattern in self.patterns), flags)

    @functools.cached_property
    def compiled(self) -> tuple[tuple[re.Pattern[str], tuple[str, ...]], ...]:
        """Each pattern with the literal anchors one of which any match must contain (lower-cased)."""
        flags = 0 if self.case_sensitive else re.IGNORECASE
        result = []
        for pattern in self.patterns:
            anchors = tuple(anchor if self.case_sensitive else anchor.lower() for anchor in _anchors(pattern))
            result.append((re.compile(pattern, flags), anchors))
        return tuple(result)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Match:
    """A knowledge-base entry found in the text, with the line that gave it away."""

    id: str
    title: str
    cause: str
    fix: str
    evidence: str
    """The (first) line of the text that matched, trimmed."""
    line: int | None = None
    """1-based line number of the evidence in the text."""
    depth: int = 0
    docs: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The match as a JSON-ready dict."""
        return dataclasses.asdict(self)


_META = set("[](){}.*+?|^$\\")


def _split_top_level(pattern: str) -> list[str]:
    parts, depth, current, index = [], 0, "", 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            current += pattern[index:index + 2]
            index += 2
            continue
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append(current)
            current = ""
            index += 1
            continue
        current += char
        index += 1
    parts.append(current)
    return parts


def _longest_literal(pattern: str) -> str:
    runs, current, index, depth = [], "", 0, 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\" and index + 1 < len(pattern):
            escaped = pattern[index + 1]
            index += 2
            if escaped.isalnum():  # \w, \d, \s, \b...: a class, not a literal
                runs.append(current)
                current = ""
            elif depth == 0:
                current += escaped
            continue
        index += 1
        if char in "([":
            depth += 1
            runs.append(current)
            current = ""
        elif char in ")]":
            depth -= 1
        elif char in "?*{" and depth == 0:
            current = current[:-1]  # the previous character is optional or repeated
            runs.append(current)
            current = ""
        elif char in "+" and depth == 0:
            runs.append(current)
            current = ""
        elif char in ".^$|" or depth > 0:
            runs.append(current)
            current = ""
        else:
            current += char
    runs.append(current)
    return max(runs, key=len)


def _anchors(pattern: str) -> tuple[str, ...]:
    """Literal substrings, one of which every match of ``pattern`` contains ("" when none is known)."""
    anchors = []
    for alternative in _split_top_level(pattern):
        literal = _longest_literal(alternative)
        if len(literal) < 3:
            return ("",)
        anchors.append(literal)
    return tuple(anchors)


@functools.lru_cache(maxsize=1)
def knowledge_base() -> tuple[KnowledgeEntry, ...]:
    """The knowledge base, loaded once from ``raysleuth/data/knowledge.json``."""
    raw = json.loads(resources.files("raysleuth").joinpath("data/knowledge.json").read_text(encoding="utf-8"))
    entries = []
    for item in raw["entries"]:
        entry = KnowledgeEntry(
            id=item["id"], title=item["title"], depth=int(item["depth"]), patterns=tuple(item["patterns"]),
            cause=item["cause"], fix=item["fix"], docs=item.get("docs"),
            case_sensitive=bool(item.get("case_sensitive", False)),
        )
        entry.compiled  # compile now: a bad pattern fails at load, not on a user's error
        entries.append(entry)
    return tuple(entries)


def _evidence(text: str, start: int) -> tuple[str, int]:
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", start)
    line = text[line_start: len(text) if line_end == -1 else line_end].strip()
    if len(line) > 300:
        offset = start - line_start
        line = ("..." if offset > 100 else "") + line[max(0, offset - 100): offset + 200].strip() + "..."
    return line, text.count("\n", 0, start) + 1


def _line_bounds(text: str, position: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, position) + 1
    end = text.find("\n", position)
    return start, len(text) if end == -1 else end


def _first_hit(text: str, haystack: str, regex: re.Pattern[str], anchor: str) -> int | None:
    """Start of the first match (searching only lines that contain the anchor)."""
    if not anchor:
        hit = regex.search(text)
        return hit.start() if hit else None
    position = haystack.find(anchor)
    while position != -1:
        start, end = _line_bounds(text, position)
        hit = regex.search(text, start, end)
        if hit:
            return hit.start()
        position = haystack.find(anchor, end)
    return None


def _last_hit(text: str, haystack: str, regex: re.Pattern[str], anchor: str) -> int | None:
    """Start of the last match's line (searching backwards through lines that contain the anchor)."""
    if not anchor:
        last = None
        for last in regex.finditer(text):
            pass
        return last.start() if last else None
    position = haystack.rfind(anchor)
    while position != -1:
        start, end = _line_bounds(text, position)
        hit = None
        for hit in regex.finditer(text, start, end):
            pass
        if hit:
            return hit.start()
        position = haystack.rfind(anchor, 0, start) if start > 0 else -1
    return None


def explain(text: str) -> list[Match]:
    """The known failures found in ``text``, root cause first (empty when none is known)."""
    if not text:
        return []
    text = _ANSI.sub("", text)
    if len(text) > _MAX_TEXT:
        text = text[: _MAX_TEXT // 8] + "\n" + text[-(_MAX_TEXT - _MAX_TEXT // 8):]
    lowered = text.lower()
    if len(lowered) != len(text):  # a few Unicode letters change length when lower-cased
        lowered = "".join(char if len(char.lower()) != 1 else char.lower() for char in text)
    found: list[tuple[int, int, Match]] = []
    for entry in knowledge_base():
        first = last = None
        haystack = text if entry.case_sensitive else lowered
        for regex, anchors in entry.compiled:
            hits = [hit for anchor in anchors for hit in (_first_hit(text, haystack, regex, anchor),
                                                            _last_hit(text, haystack, regex, anchor))
                    if hit is not None]
            if not hits:
                continue
            low, high = min(hits), max(hits)
            first = low if first is None else min(first, low)
            last = high if last is None else max(last, high)
        if first is None or last is None:
            continue
        evidence, line = _evidence(text, first)
        cause = entry.cause
        if entry.id == WRAPPER:
            inner = innermost_exception(text)
            cause = f"{cause} Here the inner exception is {inner}." if inner else cause
        found.append((entry.depth, last, Match(
            id=entry.id, title=entry.title, cause=cause, fix=entry.fix, evidence=evidence,
            line=line, depth=entry.depth, docs=entry.docs,
        )))
    found.sort(key=lambda item: (-item[0], -item[1]))
    return [match for _, _, match in found]


def explain_exception(error: BaseException) -> list[Match]:
    """:func:`explain` for an exception object (its formatted traceback and chain)."""
    try:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    except Exception:
        text = f"{type(error).__name__}: {error}"
    return explain(text)


#: The knowledge-base entry of Ray's RayTaskError wrapper: it explains nothing alone, the inner exception does.
WRAPPER = "ray-task-error"
_EXCEPTION_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning))"
                             r"(?:\([^)]*\))?: ?(.*)$")


def innermost_exception(text: str) -> str | None:
    """The last ``SomeError: message`` line of a traceback that is not Ray's wrapper (pure), trimmed."""
    for raw in reversed((text or "").splitlines()):
        found = _EXCEPTION_LINE.match(raw)
        if found and not found.group(1).startswith("RayTaskError") and found.group(1) != "RayActorError":
            message = found.group(2).strip()
            return f"{found.group(1)}: {message[:200]}" if message else found.group(1)
    return None


_ACTOR_ID = re.compile(r"\bactor[ _]id[:=]\s*([0-9a-f]{32})\b", re.IGNORECASE)
_PID = re.compile(r"\b(?:worker )?pid[:=]\s*(\d+)\b", re.IGNORECASE)


def mentioned_workers(text: str) -> dict[str, list]:
    """Actor ids and pids an error text names (Ray writes ``actor_id: ...``, ``pid=...``, ``Worker PID: ...``)."""
    text = _ANSI.sub("", text or "")[-200_000:]
    actor_ids = list(dict.fromkeys(match.group(1).lower() for match in _ACTOR_ID.finditer(text)))
    pids = list(dict.fromkeys(int(match.group(1)) for match in _PID.finditer(text)))
    return {"actor_ids": actor_ids, "pids": pids}


#: ``rs.explain_error``: the public API name of :func:`explain` (``rs.explain`` is this module).
explain_error = explain
