"""How ranks meet: the evidence writer's mailboxes, or torch.distributed.

An :class:`Exchange` runs *rounds*: every rank posts one value and gets back
everyone's (``{rank: value}``). The mailbox exchange works when NCCL is
broken (which is exactly when you need a consistency check) and has a
timeout: a rank that does not post in time is reported missing, never
waited on forever. ``torch.distributed`` is used when Ray is not connected
but a process group is initialised: an all-gather of the pickled values,
each ``wait`` bounded by the timeout (a rank that does not join is reported
missing; after such a timeout the process group may be unusable, as after
any collective timeout).

Scaling: the writer relays every value. A round costs each rank one post,
one read and a few polls of a count; a meeting ends with one ``leave``
each. In a fingerprint round (:meth:`Exchange.round_agreed`) each rank
posts a signature per tensor beside its digests, and the writer leaves out
of every read the tensors all ranks signed alike: a rank reads O(tensors)
when the ranks agree, plus every rank's digests of the tensors they do not
(O(world_size) per such tensor), not every rank's digests of every tensor
(O(world_size^2) bytes in all). Other rounds read every rank's value.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from raysleuth.agents.controls import node_agent
from raysleuth.errors import UsageError
from raysleuth.recorder import get_writer

__all__ = ["Exchange", "LocalExchange", "MailboxExchange", "TorchExchange", "open_exchange"]

#: A waiting rank's first pause between counts, and the longest (seconds; each pause is 1.5x the last).
POLL_FIRST_S, POLL_MAX_S = 0.02, 0.25
_counters: dict[tuple[str, Any], itertools.count] = {}
_counter_lock = threading.Lock()


class Exchange:
    """One rank's side of a sequence of all-gather rounds."""

    name = "none"

    def __init__(self, rank: int, world_size: int, timeout: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout

    def round(self, label: str, value: Any, expected: list[int]) -> dict[int, Any]:
        """Post ``value``; return what the ``expected`` ranks posted (fewer on timeout)."""
        raise NotImplementedError

    def round_agreed(self, label: str, values: dict[str, Any], signatures: dict[str, str],
                     expected: list[int]) -> tuple[dict[int, dict[str, Any]], set[str]]:
        """Post ``values`` (by key) with a ``signature`` per key; return each rank's values for the keys the
        ranks do not all sign alike (a rank's post whole when it has no signatures: an error), and the keys
        every rank signed alike, whose values are left out. Here: everything comes, nothing is left out."""
        return self.round(label, values, expected), set()

    def close(self, arrived: list[int], complete: bool) -> None:
        """Clean up once this rank has read the last round."""


class LocalExchange(Exchange):
    """A world of one: nothing to meet."""

    name = "local"

    def round(self, label: str, value: Any, expected: list[int]) -> dict[int, Any]:
        return {self.rank: value}


class MailboxExchange(Exchange):
    """Rounds through the writer actor's mailboxes: each rank posts once, polls a count, reads the data once.

    A round is one topic. ``post`` answers how many ranks have posted, so the
    last rank to arrive never polls; the others poll a count (an int, not the
    posts) with a back-off, through their node's agent when there is one
    (it reads the writer once per topic per 0.1 s for the node), then read
    the topic once. A meeting ends with one ``leave`` each: the writer drops
    the meeting's topics when the last rank that joined has left. Per rank
    and round the writer takes a post and a read (``bench/bench_ingest.py``
    counts them).
    """

    name = "store"

    def __init__(self, rank: int, world_size: int, timeout: float, base: str, writer: Any,
                 counter: Any = None) -> None:
        super().__init__(rank, world_size, timeout)
        self.base = base
        self.writer = writer
        #: who answers the polls of a count: the node's agent (one writer read for the node's ranks), or the writer
        self.counter = writer if counter is None else counter
        self.topics: list[str] = []

    def _call(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        import ray

        return ray.get(getattr(self.writer, method).remote(*args), timeout=timeout)

    def _read(self, method: str, *args: Any) -> Any:
        return self._call(method, *args, timeout=max(30.0, self.timeout))

    def _count(self, topic: str) -> int:
        import ray

        if self.counter is not self.writer:
            try:
                return int(ray.get(self.counter.count.remote(topic), timeout=30.0))
            except Exception:
                self.counter = self.writer  # the agent went away: ask the writer from now on
        return int(self._call("count", topic))

    def round(self, label: str, value: Any, expected: list[int]) -> dict[int, Any]:
        wanted = {str(rank) for rank in expected}
        posted = self._meet(label, value, wanted, lambda topic: self._read("read", topic), lambda got: got)
        return {int(member): item for member, item in posted.items() if member in wanted}

    def round_agreed(self, label: str, values: dict[str, Any], signatures: dict[str, str],
                     expected: list[int]) -> tuple[dict[int, dict[str, Any]], set[str]]:
        """One post; the writer leaves out the keys every rank signed alike (:meth:`EvidenceWriter.read_disputed`):
        a rank reads O(keys), not every rank's values (O(world_size^2) bytes in all)."""
        wanted = {str(rank) for rank in expected}
        members = sorted(wanted)
        answer = self._meet(label, {"agree": signatures, "values": values}, wanted,
                            lambda topic: self._read("read_disputed", topic, members), lambda got: got["members"])
        posts = answer["posts"]
        return ({int(member): posts.get(member, {}) for member in answer["members"] if member in wanted},
                set(answer["agreed"]))

    def _meet(self, label: str, value: Any, wanted: set[str], read: Any, members_of: Any) -> Any:
        """Post ``value``, wait (polling a count) until every ``wanted`` member posted or the timeout, then read."""
        topic = f"{self.base}/{label}"
        self.topics.append(topic)
        count = self._call("post", topic, str(self.rank), value)
        deadline = time.monotonic() + self.timeout
        got: Any = None
        pause = POLL_FIRST_S
        while True:
            if count >= len(wanted):  # enough posts: read them (a post by a rank not expected may inflate it)
                got = read(topic)
                if wanted <= set(members_of(got)):
                    return got
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(pause, left))
            pause = min(POLL_MAX_S, pause * 1.5)
            count = self._count(topic)
        return read(topic)  # past the deadline: what came

    def close(self, arrived: list[int], complete: bool) -> None:
        """Leave the meeting; the writer drops its topics once every rank that joined it has left.

        Joined = posted to the first round's topic, which may be more than
        ``arrived`` (a rank that came after this one's deadline). A rank past
        its deadline may still be reading the data: dropping earlier (the
        first version let the lowest rank drop an incomplete meeting at once)
        left a slower peer reading an empty topic, where it lost even its own
        post and listed every rank as missing.
        """
        if not self.topics:
            return
        try:
            self._call("leave", f"{self.base}/done", str(self.rank), self.topics[0], len(arrived), self.topics)
        except Exception:  # cleanup only: a leftover topic is harmless
            pass


class TorchExchange(Exchange):
    """Rounds through ``torch.distributed`` all-gathers whose waits time out (never waits forever)."""

    name = "torch.distributed"

    def round(self, label: str, value: Any, expected: list[int]) -> dict[int, Any]:
        import datetime
        import pickle

        import torch
        import torch.distributed as dist

        world = dist.get_world_size()
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
            else torch.device("cpu")
        payload = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8).to(device)
        deadline = time.monotonic() + self.timeout

        def gather(tensor: Any) -> list[Any]:
            out = [torch.empty_like(tensor) for _ in range(world)]
            work = dist.all_gather(out, tensor, async_op=True)
            left = max(0.001, deadline - time.monotonic())
            try:
                work.wait(timeout=datetime.timedelta(seconds=left))
            except RuntimeError as error:  # a rank did not join within the timeout
                raise TimeoutError(str(error)) from None
            return out

        try:
            sizes = gather(torch.tensor([payload.numel()], dtype=torch.int64, device=device))
            longest = int(max(int(size.item()) for size in sizes))
            padded = torch.zeros(longest, dtype=torch.uint8, device=device)
            padded[: payload.numel()] = payload
            gathered = gather(padded)
        except TimeoutError:
            return {self.rank: value} if self.rank in expected else {}
        wanted = set(expected)
        # peers are the same job's ranks (the check's own process group): their bytes are ours to load
        return {rank: pickle.loads(bytes(gathered[rank][: int(sizes[rank].item())].cpu().numpy()))  # noqa: S301
                for rank in range(world) if rank in wanted}


def _job_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_job_id()
    except Exception:
        return "nojob"


def open_exchange(key: str, step: int | None, rank: int, world_size: int, timeout: float,
                  transport: str = "auto") -> Exchange:
    """Pick how to meet: ``store`` (writer mailboxes), ``torch`` or ``local``; ``auto`` prefers the store.

    The topic is ``consistency/<job>/<key>/<step>/<n>`` where ``n`` counts this
    process's checks with that key and step: every rank calls the check the
    same number of times, so the ranks agree on it without talking.
    """

    if transport not in ("auto", "store", "torch", "local"):
        raise UsageError(f"unknown transport {transport!r}", fix="use 'auto', 'store', 'torch' or 'local'")
    if world_size <= 1 or transport == "local":
        return LocalExchange(rank, max(1, world_size), timeout)
    ray_up = _ray_initialized()
    if transport == "store" or (transport == "auto" and ray_up):
        with _counter_lock:
            counter = _counters.setdefault((key, step), itertools.count())
            sequence = next(counter)
        base = f"consistency/{_job_id()}/{key}/{step}/{sequence}"
        import ray  # lazy: importing raysleuth never imports Ray; a store meeting runs where Ray is up

        return MailboxExchange(rank, world_size, timeout, base, get_writer(), node_agent(ray, "count"))
    if _torch_distributed_ready():
        return TorchExchange(rank, world_size, timeout)
    raise UsageError(
        f"rank {rank} of {world_size} has no way to meet its peers",
        fix="connect to Ray (the check meets through the evidence writer) or initialise torch.distributed",
    )


def _ray_initialized() -> bool:
    import sys

    ray = sys.modules.get("ray")
    try:
        return bool(ray is not None and ray.is_initialized())
    except Exception:
        return False


def _torch_distributed_ready() -> bool:
    import sys

    if "torch" not in sys.modules:
        return False
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()
    except Exception:
        return False
