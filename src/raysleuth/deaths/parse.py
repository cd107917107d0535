"""Parsers for what dying workers and Ray write: faulthandler dumps, exit codes, init tracebacks,
Ray's memory-monitor report. Pure functions over text."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

__all__ = ["LIBRARY_PATHS", "FatalSignal", "exit_code", "fatal_file_rank", "init_exception", "memory_monitor_report",
           "parse_fatal"]

_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
_FATAL = re.compile(r"Fatal Python error: ([^\n]+)")
_RECEIVED = re.compile(r"\*\*\* (SIG[A-Z]+) received")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')
_STACK_HEAD = re.compile(r"^(?:Stack|Current thread 0x[0-9a-f]+|Thread 0x[0-9a-f]+)[^\n]*\(most recent call first\):")
_EXIT_CODE = re.compile(r"exits? with an exit code (-?\d+)")
_TOP_USER = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+(.+?)\s*$")
_NODE_MEMORY = re.compile(r"was ([\d.]+)GB used / ([\d.]+)GB limit")
LIBRARY_PATHS = ("site-packages/", "dist-packages/", "/lib/python3", "python/ray/", "<frozen ")


@dataclasses.dataclass(kw_only=True)
class FatalSignal:
    """What ``faulthandler`` (Ray's worker or raysleuth's fatal file) wrote when the process died."""

    error: str
    """``Fatal Python error: <error>`` (e.g. ``Segmentation fault``)."""
    signal: str | None
    """SIGSEGV, SIGABRT... when the text names it."""
    frames: list[dict[str, Any]]
    """The crashing thread's Python stack, most recent call first: file, line, function."""
    function: str | None
    """The innermost Python function."""
    file: str | None
    line: int | None
    user_function: str | None = None
    """The innermost frame outside libraries (site-packages, Ray, the standard library)."""
    user_file: str | None = None
    user_line: int | None = None
    source: str = "worker log"


def parse_fatal(text: str, *, source: str = "worker log") -> FatalSignal | None:
    """The last ``Fatal Python error`` in ``text`` with the crashing thread's stack, or None."""
    if not text:
        return None
    matches = list(_FATAL.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    error = last.group(1).strip()
    signal = _SIGNALS.get(error)
    received = list(_RECEIVED.finditer(text, 0, last.start()))
    if received:
        signal = received[-1].group(1)
    frames: list[dict[str, Any]] = []
    in_stack = False
    for line in text[last.end():].splitlines():
        if not in_stack:
            if _STACK_HEAD.match(line.strip()):
                in_stack = True
            continue
        frame = _FRAME.match(line)
        if frame:
            frames.append({"file": frame.group(1), "line": int(frame.group(2)), "function": frame.group(3)})
        elif frames or line.strip():
            break  # the crashing thread's block ended (other threads follow)
    first = frames[0] if frames else {}
    user = next((frame for frame in frames if not any(part in frame["file"] for part in LIBRARY_PATHS)), None)
    return FatalSignal(error=error, signal=signal, frames=frames, function=first.get("function"),
                       file=first.get("file"), line=first.get("line"),
                       user_function=user["function"] if user else None, user_file=user["file"] if user else None,
                       user_line=user["line"] if user else None, source=source)


def exit_code(text: str) -> int | None:
    """The exit code in Ray's ``Worker exits with an exit code N``, else None."""
    match = _EXIT_CODE.search(text or "")
    return int(match.group(1)) if match else None


def init_exception(formatted: str) -> tuple[str | None, str | None]:
    """``(type, message)`` of the user's exception in a creation task's formatted traceback."""
    lines = [line for line in (formatted or "").splitlines() if line.strip()]
    for line in reversed(lines):
        match = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)|[A-Z]\w*Error):\s?(.*)$",
                         line.strip())
        if match and not match.group(1).startswith("ray.exceptions"):
            return match.group(1).rsplit(".", 1)[-1], match.group(2)
    return None, None


def memory_monitor_report(text: str) -> dict[str, Any]:
    """Ray's memory-monitor kill text: node used/limit and the top memory users it names."""
    result: dict[str, Any] = {"top_users": []}
    node = _NODE_MEMORY.search(text or "")
    if node:
        result["node_used_gb"], result["node_limit_gb"] = float(node.group(1)), float(node.group(2))
    start = (text or "").find("Top 10 memory users:")
    if start >= 0:
        for line in text[start:].splitlines()[1:]:
            match = _TOP_USER.match(line)
            if not match:
                if result["top_users"]:
                    break
                continue
            result["top_users"].append({"pid": int(match.group(1)), "memory_gb": float(match.group(2)),
                                        "command": match.group(3)[:120]})
    return result




_FILE_RANK = re.compile(r"^# (?:raysleuth fatal-signal file .*?)?\brank=(\d+)", re.MULTILINE)


def fatal_file_rank(text: str | None) -> int | None:
    """The rank in a zero-code fatal-signal file's header (``rank=<n>``, or a later ``# rank=<n>`` line)."""
    found = _FILE_RANK.findall(text or "")
    return int(found[-1]) if found else None
