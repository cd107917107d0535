"""A node agent's tools run with a deadline (``agents.host.run_tool``): real processes, real py-spy, no Ray."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from raysleuth.agents.host import find_tool, run_tool

SLEEPER = "import time\ndef nap():\n    time.sleep(0.05)\nwhile True:\n    nap()\n"


@pytest.fixture
def sleeper():
    child = subprocess.Popen([sys.executable, "-c", SLEEPER])
    time.sleep(0.5)
    yield child.pid
    child.kill()
    child.wait()


def test_a_tool_that_ends_in_time_gives_its_output():
    done = run_tool([sys.executable, "-c", "print('hi')"], timeout=10, interrupt_s=3)
    assert (done["returncode"], done["stdout"], done["timed_out"], done["error"]) == (0, "hi\n", False, None)


def test_a_py_spy_past_its_deadline_is_interrupted_and_its_samples_come_back(sleeper):
    py_spy = find_tool("py-spy")
    if py_spy is None:
        pytest.skip("py-spy is not installed")
    argv = [py_spy, "record", "--pid", str(sleeper), "--nonblocking", "--idle", "--format", "raw", "--rate", "5",
            "--duration", "60", "-o", "/dev/stdout"]
    done = run_tool(argv, timeout=5, interrupt_s=3)  # 5 s: py-spy has started sampling on a loaded machine too
    assert done["timed_out"] and done["seconds"] < 10, done
    assert "nap (<string>:3)" in done["stdout"], done
    # without the interruption, the samples are lost with the tool
    done = run_tool(argv, timeout=3)
    assert done["timed_out"] and "nap" not in done["stdout"] and done["seconds"] < 5, done


def test_a_tool_deaf_to_the_interruption_is_killed_after_its_grace():
    deaf = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('started', flush=True)\ntime.sleep(60)"
    started = time.monotonic()
    done = run_tool([sys.executable, "-c", deaf], timeout=2, interrupt_s=1)
    assert done["timed_out"] and done["returncode"] == -9 and done["stdout"] == "started\n", done
    assert time.monotonic() - started < 6
    assert run_tool(["/nonexistent/tool"], timeout=1)["error"]
