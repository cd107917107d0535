"""``recorder.allocator``: a one-shot reading command keeps what it frees for its next arrays (in a process of its
own: the settings are the whole process's)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_CHURN = """
import json, resource, sys
import numpy as np
from raysleuth.recorder import reading
core = getattr(np, "_core", None) or np.core  # numpy 2's module, numpy 1's
huge = bool(core.multiarray._get_madvise_hugepage())
if sys.argv[1] != "default":
    if sys.argv[1] == "one-shot":
        reading.command_line_process()
    reading.one_shot()
    huge = bool(core.multiarray._get_madvise_hugepage())
core.multiarray._set_madvise_hugepage(False)  # the pages counted alike (a huge page is one fault)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(6):  # the report's way: an array of 64 MB made, filled and dropped, again and again
    array = np.empty(8 << 20)
    array[:] = 1.0
    del array
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"faults": faults, "huge": huge}))
"""


def _churn(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_one_shot_reader_faults_its_memory_in_once():
    kept, default = _churn("one-shot"), _churn("default")
    pages = (64 << 20) // 4096
    assert kept["huge"] is False  # numpy's madvise of huge pages off (the default where the kernel allows it: on)
    assert kept["faults"] < 2 * pages < 5 * pages < default["faults"], (kept, default)  # once, not six times


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_process_that_lives_on_keeps_its_allocator():
    """``one_shot`` outside the command line's own process (a test, the writer, a job calling ``main``) changes
    nothing: its arrays fault in as before, and numpy's huge pages stay as they were."""
    lives_on, default = _churn("lives-on"), _churn("default")
    assert lives_on["huge"] == default["huge"] and lives_on["faults"] > 5 * (64 << 20) // 4096, lives_on
