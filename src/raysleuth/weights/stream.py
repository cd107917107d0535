"""Both sides of a sync, in flight: :func:`weights_sent` and :func:`weights_received`.

Each wraps the iterable of ``(name, tensor)`` a sync moves (a generator, a
list, ``model.named_parameters()``, or an async iterator) and passes every
item through unchanged, lazily, fingerprinting it on the way. When the
stream ends (or is closed early) one ``weight_sync`` record is written with
the side, the version, this process's rank and one print per tensor.

Cost: one fingerprint per tensor (XXH3 at memory speed on the CPU, on the
device on CUDA); only digests leave the process. ``bench/bench_weights.py``
measures it against the sync itself.

Where the digest runs. Both sides digest each tensor before the caller
gets past it: the sender before it pulls the next item from its source
(which may refill one buffer for every item), the receiver before it hands
the item on. On the sending side a CPU tensor of 1 MiB or more is digested
on a worker thread while the send has it (both only read; XXH3 releases
the GIL while it reads), finished before the next item is pulled and
before the record is written; smaller ones stay on the caller's thread
(their digest is mostly Python holding the GIL: a hand-off only adds a
wait). The receiving side digests inline, before the loader sees the
tensor. Not done, and why: overlapping the receiver's digest with the
next receipt (an engine may refill its buffer as soon as its generator
resumes: verl's buckets), or with the loader's work on the item (a loader
may change a received tensor in place, and a digest racing that write
would report a false "differs"; torch's version counter cannot rule it
out: writes through ``.data`` or a numpy view do not count, and tensors
made under ``torch.inference_mode`` have none); hashing one tensor's
chunks on a small thread pool (on a loaded 2-core machine a 2-thread pool
took 87-535 ms for 256 MiB that one thread hashed in 10-34 ms). CUDA
tensors are digested inline on the caller's thread and its current stream
(a worker thread would run on another stream, unordered with the kernels
that produced them).

Scale: a record holds 8 bytes (as 16 hex digits) per 4 MiB chunk, ~0.6 MB
per side for a 70B bf16 model; past that, store the chunk digests in a side
table instead of the record's JSON.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import AsyncIterable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from raysleuth import runtime
from raysleuth.errors import UsageError
from raysleuth.weights.prints import WeightPrint, print_tensor

__all__ = ["KIND", "SyncSide", "next_version", "pass_through", "weights_received", "weights_sent"]

#: The evidence kind of every record this package writes.
KIND = "weight_sync"

_versions: dict[str, itertools.count] = {}
_versions_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _digest_pool() -> ThreadPoolExecutor:
    """The process's one digest thread (made on first use; a forked child makes its own)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raysleuth-weights")
        return _pool


def _forget_pool() -> None:
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


#: Smaller tensors are digested on the caller's thread. A small tensor's digest is mostly Python holding the
#: GIL (~50-100 us against <1 us of XXH3 reading 8 KiB), so on the digest thread it runs no more in parallel
#: with the send and adds a hand-off, during which the caller waits for the GIL.
OVERLAP_MIN_BYTES = 1024 * 1024


def _overlappable(tensor: Any) -> bool:
    """A dense, unquantized torch CPU tensor of OVERLAP_MIN_BYTES or more: digested off the caller's thread.

    Such a tensor cannot fail to prepare, so nothing that can reject an item runs on the digest thread.
    """
    torch = sys.modules.get("torch")
    return (torch is not None and isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"
            and tensor.layout == torch.strided and not tensor.is_quantized
            and tensor.numel() * tensor.element_size() >= OVERLAP_MIN_BYTES)


def next_version(side: str) -> int:
    """This process's next automatic version for ``side`` (0, 1, 2...)."""
    with _versions_lock:
        return next(_versions.setdefault(side, itertools.count()))


class SyncSide:
    """What one process saw of one sync: prints accumulated item by item, recorded once at the end."""

    def __init__(self, side: str, version: int | None, *, shard: int | None = None, canonical: str | None = None,
                 source: str = "api", strict: bool = True, algorithm: str = "auto",
                 overlap: bool | None = None) -> None:
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise UsageError(f"weights_{side}: version={version!r} is not an int", fix="pass the trainer step")
        self.side, self.shard, self.canonical, self.source = side, shard, canonical, source
        self.strict, self.algorithm = strict, algorithm
        self.overlap = side == "sent" if overlap is None else overlap
        self.pending: Future | None = None
        self.version = next_version(side) if version is None else version
        self.prints: list[WeightPrint] = []
        self.bytes = 0
        self.seconds = 0.0
        self.error: str | None = None
        self.errors = 0
        self.done = False
        self.position = 0

    def see(self, item: Any) -> None:
        """Fingerprint one item of the stream (errors: raised when strict, else noted once).

        With ``overlap``, a CPU tensor's digest is started on the digest thread
        and :meth:`settle` waits for it; everything that can reject the item
        (not a pair, not a tensor) still runs here, on the caller's thread.
        """
        self.settle()
        self.position += 1
        started = time.perf_counter()
        try:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise UsageError(f"weights_{self.side}: item {self.position} of version {self.version} is "
                                 f"{type(item).__name__}, not a (name, tensor) pair",
                                 fix="pass an iterable of (name, tensor), e.g. model.named_parameters()")
            name, tensor = item
            if self.overlap and isinstance(name, str) and _overlappable(tensor):
                try:
                    self.pending = _digest_pool().submit(self._digest, name, tensor)
                except RuntimeError:  # the interpreter is shutting down: no new threads, digest here
                    self._digest(name, tensor)
            else:
                self._digest(name, tensor)
        except UsageError as error:
            if self.strict:
                self.finish(complete=False, error=str(error))
                raise
            self._note(str(error))
        except Exception as error:  # a fingerprint that fails never stops the sync
            self._note(f"{type(error).__name__}: {error}")
        finally:
            self.seconds += time.perf_counter() - started

    def _digest(self, name: Any, tensor: Any) -> float:
        """One print (on either thread); returns the seconds it took, counted once the digest is settled."""
        started = time.perf_counter()
        self.prints.append(print_tensor(name, tensor, shard=self.shard, canonical=self.canonical,
                                        algorithm=self.algorithm))
        self.bytes += int(tensor.numel() * tensor.element_size()) if hasattr(tensor, "element_size") \
            else int(getattr(tensor, "nbytes", 0))
        return time.perf_counter() - started

    def settle(self) -> None:
        """Wait for the digest in flight (before the source is asked for its next item, before the record)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        try:
            self.seconds += pending.result()
        except Exception as error:  # a fingerprint that fails never stops the sync
            self._note(f"{type(error).__name__}: {error}")

    async def settle_async(self) -> None:
        """:meth:`settle` without blocking the event loop."""
        import asyncio  # here: a reader of the module (the report) loads no event loop machinery

        if self.pending is not None:
            try:
                await asyncio.wrap_future(self.pending)
            except Exception:
                pass  # noted by settle
        self.settle()

    def _note(self, error: str) -> None:
        """Keep the first error (the item is left out of the record: it shows as missing on this side)."""
        self.errors += 1
        if self.error is None:
            self.error = error

    def to_dict(self, complete: bool) -> dict[str, Any]:
        return {"side": self.side, "version": self.version, "shard": self.shard, "rank": runtime.get_rank(),
                "pid": os.getpid(), "source": self.source, "count": len(self.prints), "items": self.position,
                "bytes": self.bytes, "seconds": round(self.seconds, 6), "complete": complete,
                "canonical": self.canonical, "overlap": self.overlap, "error": self.error, "errors": self.errors,
                "tensors": [p.to_dict() for p in self.prints]}

    def finish(self, *, complete: bool, error: str | None = None) -> None:
        """Write this side's record (once)."""
        if self.done:
            return
        self.done = True
        self.settle()
        if error is not None:
            self.error = error
        try:
            # the instruments here: rs.check_weight_sync and rs.weights_received, called in workers.
            # lazy: the instruments stay light to import: the recorder loads when a sync is recorded
            from raysleuth.recorder import record

            record(KIND, self.to_dict(complete), name=self.side, step=self.version,
                   level="WARNING" if self.error else "INFO")
        except Exception:
            pass


def pass_through(iterable: Any, side: SyncSide) -> Any:
    """``iterable`` passed through unchanged, each item shown to ``side`` (async in, async out)."""
    if isinstance(iterable, AsyncIterable) or hasattr(iterable, "__aiter__"):
        return _async_passthrough(iterable, side)
    if not isinstance(iterable, Iterable) or isinstance(iterable, (str, bytes)):
        raise UsageError(f"weights_{side.side}: expected an iterable of (name, tensor), got "
                         f"{type(iterable).__name__}", fix="pass e.g. model.named_parameters() or a generator")
    if hasattr(iterable, "items") and callable(iterable.items):
        iterable = iterable.items()  # a state dict
    return _sync_passthrough(iterable, side)


def _sync_passthrough(iterable: Iterable, side: SyncSide):
    complete = False
    try:
        for item in iterable:
            side.see(item)
            yield item
            side.settle()  # before the source may reuse the item's buffer for the next one
        complete = True
    finally:
        side.finish(complete=complete)


async def _async_passthrough(iterable: Any, side: SyncSide):
    complete = False
    try:
        async for item in iterable:
            side.see(item)
            yield item
            await side.settle_async()
        complete = True
    finally:
        side.finish(complete=complete)


def weights_sent(named_tensors: Any, *, version: int | None = None, shard: int | None = None,
                 canonical: str | None = None) -> Any:
    """The trainer's side of a sync: ``named_tensors`` passed through unchanged, each fingerprinted.

    ``version``: the sync's version (the trainer step; default: this process's count of syncs).
    ``shard``: which shard these tensors are (a tensor-parallel rank sending its own part).
    ``canonical``: also digest wider floats at this lower precision (``"bfloat16"``), for a receiver
    that holds them so. Sync iterables give a generator, async ones an async generator.
    """
    return pass_through(named_tensors, SyncSide("sent", version, shard=shard, canonical=canonical))


def weights_received(named_tensors: Any, *, version: int | None = None, shard: int | None = None,
                     canonical: str | None = None) -> Any:
    """The rollout side of a sync: what arrived, passed through unchanged to the loader, each fingerprinted."""
    return pass_through(named_tensors, SyncSide("received", version, shard=shard, canonical=canonical))
