"""Collective forensics: which rank broke the collective sequence (issue 15 fills this in).

Interface kept stable for the other features:

- ``install()``: called in a worker by the zero-code setup (issue 14) before
  user code runs. Switches torch's Flight Recorder on (``TORCH_FR_BUFFER_SIZE``
  unless already set) and, where it can, counts completed collectives as
  progress. Never raises; cheap; a no-op without torch.
"""

from __future__ import annotations


def install() -> None:
    """Prepare collective recording in this worker (stub until issue 15 lands)."""
    return None


def dump(reason: str = "request") -> None:
    """Write this process's collective records to the evidence store (stub until issue 15 lands)."""
    return None
