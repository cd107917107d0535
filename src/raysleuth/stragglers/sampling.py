"""Sample a few processes' stacks a few times a second, through the node agents (py-spy, non-blocking).

One ``py-spy record --nonblocking`` per process, all at once, on each
process's node (``run_tools`` on its agent): py-spy reads the process's
memory without stopping it (a blocking read pauses every thread at each
sample, which slows a torch process with many threads: py-spy #872), at a
low rate, for a few seconds. Its collapsed output comes back as text.

Cost (py-spy 0.4.3's own rusage on a gloo DDP Ray actor of 34 OS threads,
6 of them Python's; ``bench/bench_stragglers.py`` measures it): 12-18 ms
of CPU to start (reading the process's maps and the interpreter's
symbols), then 1.1-1.4 ms per sample, whatever the flags, mostly system
time (reading the process's memory: every Python thread's stack, not only
the key thread's; py-spy has no flag to pick one). ``--idle``, ``--threads``
and ``--full-filenames`` cost nothing measurable, and the phase needs them:
the slow read and the peers' wait are idle time (without ``--idle``, 13 of
114 samples were left), the key thread is told apart by its thread, and
own code by its full path. So the cost is cut by taking few samples over a
long window, which spreads the start-up too: 1 a second for 8 s (9
samples, about 0.33% of a core while it samples, start-up included)
instead of 2 a second for 5 s (11 samples, 0.59-0.73%) or 5 a second for
3 s (16 samples, 1.06-1.23%); a verdict comes 3 s later. One py-spy per
node would not help: it takes one ``--pid`` (``--subprocesses`` would
sample every worker under the raylet), and the start-up is per process
sampled anyway.
"""

from __future__ import annotations

import os
import time
from typing import Any

from raysleuth import agents

RATE = 1
"""Samples per second."""
SECONDS = 8.0
"""How long to sample."""
ROUNDS = 6
"""Most rounds of :data:`SECONDS` while the slow phase is not clear (``phase.LEAD``): a rank with 60 % of its
samples in its slow place and 37 % in a place where its peer has 32 % is told in 1 round 33 % of the time, in 3
rounds 77 %, in 6 rounds 97 % (``tests/test_stragglers_logic.py``)."""


SLACK_S = 10.0
"""How much longer than its window a py-spy may take (start-up on a loaded node) before it is interrupted."""
INTERRUPT_S = 3.0
"""How long an interrupted py-spy has to write the samples it took (it checks for Control-C at each sample)."""


def _argv(path: str, pid: int, rate: int, seconds: float) -> list[str]:
    return [path, "record", "--pid", str(pid), "--nonblocking", "--idle", "--threads", "--full-filenames",
            "--format", "raw", "--rate", str(rate), "--duration", str(max(1, round(seconds))), "-o", "/dev/stdout"]


def sample_processes(targets: dict[int, tuple[str, int]], *, rate: int = RATE, seconds: float = SECONDS,
                     timeout: float | None = None) -> tuple[dict[int, str], dict[int, str], dict[str, Any]]:
    """Sample ``targets`` (rank -> (node id, pid)); returns (rank -> raw text, rank -> error, cost).

    A py-spy still running :data:`SLACK_S` after its window is interrupted, and the samples it wrote count;
    ``timeout`` (the agents' answer) defaults to the window plus both margins.
    """
    timeout = seconds + SLACK_S + INTERRUPT_S + 5.0 if timeout is None else timeout  # 5 s: the agents' reply
    started = time.monotonic()
    texts: dict[int, str] = {}
    errors: dict[int, str] = {}
    found = agents.call_agents("versions", timeout=min(timeout, 15.0), nodes=sorted({n for n, _ in targets.values()}))
    paths = {result.node_id: (result.value or {}).get("py_spy_path") for result in found if result.ok}
    per_node: dict[str, list[tuple[int, int]]] = {}
    for rank, (node_id, pid) in targets.items():
        if not paths.get(node_id):
            errors[rank] = ("py-spy not found on this rank's node: install it in the job's environment "
                            '(pip install py-spy, or runtime_env={"pip": ["py-spy"]})')
            continue
        per_node.setdefault(node_id, []).append((rank, pid))
    per_node_args = {node: ([_argv(str(paths[node]), pid, rate, seconds) for _, pid in members], seconds + SLACK_S,
                            len(members), INTERRUPT_S) for node, members in per_node.items()}
    if per_node_args:
        results = agents.call_agents("run_tools", timeout=timeout, nodes=list(per_node_args),
                                     per_node_args=per_node_args)
        for result in results:
            members = per_node[result.node_id]
            if not result.ok:
                errors.update({rank: f"node agent did not answer: {result.error}" for rank, _ in members})
                continue
            for (rank, _pid), done in zip(members, result.value):
                if done.get("stdout") and (done.get("returncode") == 0 or done.get("timed_out")):
                    texts[rank] = done["stdout"]  # an interrupted py-spy's samples are as good, only fewer
                else:
                    text = (done.get("error") or done.get("stderr") or "").strip().splitlines()
                    errors[rank] = f"py-spy: {text[-1][:200] if text else 'no samples'}"
    cost = {"rate": rate, "seconds": seconds, "processes": len(targets), "sampled": len(texts),
            "wall_s": time.monotonic() - started}
    return texts, errors, cost


def library_dirs() -> tuple[str, ...]:
    """Folders whose frames are not the job's own code: raysleuth's package."""
    return (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)
