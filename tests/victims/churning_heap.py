"""Victim: a process whose threads build and free containers while a memory capsule is taken.

Run as ``python -m victims.churning_heap ROUNDS``: four threads keep
building tuples from generators (a tuple is tracked by the garbage
collector while it is still being filled), lists, dicts and sets of
buffers, and freeing them; torch.distributed is imported (its deprecated
``reduce_op`` warns when touched); the main thread takes ROUNDS memory
capsules through ``rs.memory.on_threshold(..., "capture")``'s own capture
function, then one more once the threads stopped. Prints ``CAPSULES <n>
HOLDERS <owners> PARTIAL <walks cut by their budget> MISSED <whole walks
that did not name the holder> QUIET <owners once the churn stopped>`` and
exits 0 if nothing crashed.
"""

from __future__ import annotations

import sys
import threading


def churn(stop: threading.Event) -> None:
    keep = []
    while not stop.is_set():
        built = tuple(bytearray(64) for _ in range(200))  # partly filled while the generator runs
        table = {n: (n, str(n)) for n in range(200)}
        keep.append([built, table, {frozenset(range(n % 7)) for n in range(50)}])
        if len(keep) > 20:
            keep.clear()


class Leaker:
    """Holds the memory the capsule should name."""

    def __init__(self) -> None:
        self.buffers = [bytearray(1 << 20) for _ in range(24)]


def main(rounds: int) -> None:
    import torch.distributed  # noqa: F401  (its reduce_op shim warns when an attribute is read)

    from raysleuth.memory.triggers import capture_capsule

    sys.setswitchinterval(1e-5)  # switch threads as often as possible: the walk meets half-built objects
    leaker = Leaker()
    stop = threading.Event()
    threads = [threading.Thread(target=churn, args=(stop,), daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    owners, partial, missed = set(), 0, 0
    for _ in range(rounds):
        capsule = capture_capsule(reason="test", metric="rss_bytes", value=None, threshold=None)
        named = {holder["owner"] for holder in capsule["holders"]}
        owners |= named
        partial += bool(capsule.get("partial"))  # the walk's 2 s ran out: the capsule says so
        missed += not capsule.get("partial") and "Leaker.buffers" not in named  # a whole walk must name it
    stop.set()
    for thread in threads:
        thread.join()
    quiet = capture_capsule(reason="test", metric="rss_bytes", value=None, threshold=None)  # the walk still works
    print("CAPSULES", rounds, "HOLDERS", "|".join(sorted(owners)), "PARTIAL", partial, "MISSED", missed,
          "QUIET", "|".join(sorted(holder["owner"] for holder in quiet["holders"])), flush=True)
    assert leaker.buffers


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
