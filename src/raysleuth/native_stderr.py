"""Hide the known noise native code writes to stderr during one call, keep everything else.

Ray's C++ client logs straight to file descriptor 2 (not through Python's
``sys.stderr``), e.g. ``gcs_client.cc:210: Failed to get cluster ID from GCS
server: Unauthenticated: RPC error: InvalidAuthToken`` when raysleuth's own
probe asks a token cluster without a token, which it does on purpose to learn
whether a token is needed. :func:`filtered_stderr` points fd 2 at a
temporary file for the duration of the call, then writes back every line
that does not match the given patterns, so a real error still reaches the
terminal (after the call instead of during it).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["filtered_stderr"]


@contextlib.contextmanager
def filtered_stderr(drop: re.Pattern[str]) -> Iterator[None]:
    """Within the block, lines written to fd 2 that match ``drop`` are discarded; the rest are written back."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        capture = tempfile.TemporaryFile()
        os.dup2(capture.fileno(), 2)
    except (OSError, ValueError, AttributeError):  # no fd 2 to redirect (embedded, closed): leave it be
        yield
        return
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)
        os.close(saved)
        try:
            capture.seek(0)
            kept = [line for line in capture.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if not drop.search(line)]
            if kept:
                os.write(2, "".join(kept).encode())
        finally:
            capture.close()
