"""From the driver: compare what actors hold, seed them, without changing their classes.

Both go through ``actor.__ray_call__`` (Ray runs ``fn(actor_instance)`` in
the actor). :func:`compare` ships only fingerprints back; the value stays in
the actor until the driver asks for the one chunk that disagrees.
"""

from __future__ import annotations

import functools
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from raysleuth import runtime
from raysleuth.consistency.report import ConsistencyReport, algorithms_of, compare_fingerprints, localize
from raysleuth.fingerprints import chunk_bytes, fingerprint, named_items
from raysleuth.ray_private import ray_call
from raysleuth.recorder import record as store

__all__ = ["SeedReport", "compare", "set_random_seed"]

log = logging.getLogger("raysleuth.consistency")
_stash: dict[str, dict[str, Any]] = {}  # in each actor: token -> the values fn returned


def _named_result(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, np.ndarray) or type(value).__module__.startswith("torch"):
        return [("result", value)]
    if isinstance(value, (int, float, bool, complex, np.generic)):
        return [("result", np.asarray(value))]
    if isinstance(value, (str, bytes, bytearray)):
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return [("result", np.frombuffer(raw, np.uint8))]
    if isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for name, item in value.items():
            named = _named_result(item)
            out.extend((str(name) if sub == "result" else f"{name}.{sub}", v) for sub, v in named)
        return out
    if isinstance(value, (list, tuple)) and not (len(value) == 2 and isinstance(value[0], str)):
        return [(f"{i}" if sub == "result" else f"{i}.{sub}", v)
                for i, item in enumerate(value) for sub, v in _named_result(item)]
    return named_items(value, prefix="result")


def _run_and_fingerprint(actor: Any, fn: Callable[[Any], Any], token: str, stats: bool) -> dict[str, Any]:
    values = dict(_named_result(fn(actor)))
    _stash[token] = values
    return {name: fingerprint(value, name=name, stats=stats) for name, value in values.items()}


def _ship_chunks(actor: Any, token: str, wanted: list[tuple[str, int]], fps: dict[str, Any]) -> dict:
    values = _stash.get(token, {})
    return {(name, chunk): chunk_bytes(values[name], fps[name], chunk) for name, chunk in wanted}


def _mix64_again(actor: Any, token: str, names: list[str], stats: bool) -> dict[str, Any]:
    values = _stash.get(token, {})
    return {name: fingerprint(values[name], name=name, stats=stats, algorithm="mix64")
            for name in names if name in values}


def _rehash(handles: list[Any], posted: dict[int, dict[str, Any]], names: list[str], token: str,
            deadline: float, report: ConsistencyReport) -> None:
    """Every rank fingerprints ``names`` again with ``mix64`` (same digests on CPU and CUDA)."""
    import ray

    refs = {rank: ray_call(handles[rank], functools.partial(
        _mix64_again, token=token, names=names, stats=report.atol > 0 or report.rtol > 0)) for rank in posted}
    for rank, ref in refs.items():
        try:
            posted[rank].update(ray.get(ref, timeout=max(1.0, deadline - time.monotonic())))
        except Exception as error:
            report.notes.append(f"rank {rank}: could not rehash {names} with mix64: {type(error).__name__}")


def _forget(actor: Any, token: str) -> None:
    _stash.pop(token, None)


def _remote_error(error: BaseException) -> str:
    """``ValueError: boom (at train.py:12 in check)`` for an exception raised in a worker."""
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    what = f"{type(cause).__name__}: {text[-1][:300] if text else ''}".rstrip(": ")
    where = None
    for line in f"{getattr(error, 'traceback_str', '') or ''}\n{error}".splitlines():
        line = line.strip()
        if line.startswith('File "') and "/ray/" not in line and "raysleuth/consistency" not in line:
            where = line
    if where:
        path, _, rest = where[len('File "'):].partition('", line ')
        number, _, function = rest.partition(", in ")
        where = f"{path.rsplit('/', 1)[-1]}:{number} in {function}"
    return f"{what} (at {where})" if where else what


def compare(actor_handles: list[Any], fn: Callable[[Any], Any], atol: float = 0, rtol: float = 0, *,
            timeout: float = 60, key: str = "compare", record: bool = True) -> ConsistencyReport:
    """Run ``fn(actor_instance)`` on every actor (via ``__ray_call__``) and compare the results.

    ``fn`` may return a tensor, an array, a number, bytes/str, or a dict/list
    of those. Rank = position in ``actor_handles``. Actors that fail or do not
    answer within ``timeout`` are reported in ``missing_ranks`` with the reason
    in ``notes``. Bitwise unless ``atol``/``rtol`` are given.
    """
    import ray

    started = time.monotonic()
    handles = list(actor_handles)
    token = uuid.uuid4().hex
    tolerance = atol > 0 or rtol > 0
    report = ConsistencyReport(key=key, consistent=False, world_size=len(handles), timeout=timeout,
                               atol=atol, rtol=rtol, transport="ray_call")
    run = functools.partial(_run_and_fingerprint, fn=fn, token=token, stats=tolerance)
    refs = {rank: ray_call(handle, run) for rank, handle in enumerate(handles)}
    posted: dict[int, dict[str, Any]] = {}
    raised: dict[str, list[int]] = {}
    deadline = time.monotonic() + timeout
    for rank, ref in refs.items():
        try:
            posted[rank] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            report.notes.append(f"rank {rank}: no answer within {timeout}s")
        except Exception as error:
            what = _remote_error(error)
            raised.setdefault(what, []).append(rank)
            report.notes.append(f"rank {rank}: {what}")
    if raised:  # fn raised in the workers: say what and where, not "did not arrive"
        report.error = "; ".join(f"fn raised {what} on rank(s) {ranks}" for what, ranks in raised.items())
    report.arrived_ranks = sorted(posted)
    report.missing_ranks = [rank for rank in refs if rank not in posted]
    try:
        if posted:
            report.tensors_checked = len({name for fps in posted.values() for name in fps})
            mismatches, requests, rehash = compare_fingerprints(posted)
            if rehash:  # ranks digested alike-named tensors differently (CPU xxh3, CUDA mix64): rehash as mix64
                _rehash(handles, posted, rehash, token, deadline, report)
                mismatches, requests, still = compare_fingerprints(posted)
                for name in still:
                    report.incomparable.append(name)
                    report.notes.append(f"{name}: not compared, digests differ in algorithm "
                                        f"({algorithms_of(posted, name)})")
            payloads: dict[int, dict] = {}
            by_rank: dict[int, list[tuple[str, int]]] = {}
            for request in requests:
                by_rank.setdefault(request.rank, []).append((request.name, request.chunk))
            chunk_refs = {rank: ray_call(handles[rank],
                functools.partial(_ship_chunks, token=token, wanted=wanted, fps=posted[rank]))
                for rank, wanted in by_rank.items()}
            for rank, ref in chunk_refs.items():
                try:
                    payloads[rank] = ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
                except Exception as error:
                    report.notes.append(f"rank {rank}: could not ship chunks: {type(error).__name__}")
            for mismatch in list(mismatches):
                if mismatch.kind == "value" and localize(mismatch, posted, payloads, atol=atol, rtol=rtol):
                    mismatches.remove(mismatch)
                    report.within_tolerance.append(mismatch.name)
            report.mismatches = mismatches
    except Exception as error:
        report.error = f"{type(error).__name__}: {error}"
    finally:
        for rank in posted:
            ray_call(handles[rank], functools.partial(_forget, token=token))
    report.settle()
    report.seconds = round(time.monotonic() - started, 4)
    (log.info if report.consistent else log.warning)(report.summary())
    if record:
        store("consistency", report.to_dict(), name=key, level=report.level)
    return report


# ---------------------------------------------------------------- seeds


@dataclass
class SeedReport:
    """Which seed each process got."""

    seed: int
    driver_seed: int | None
    worker_seeds: dict[int, int] = field(default_factory=dict)
    """Rank (the worker's own, else its position) -> seed (``seed + rank``)."""
    errors: dict[int, str] = field(default_factory=dict)


def seed_everything(seed: int) -> int:
    """Seed python's ``random``, numpy, and torch (when installed) in this process."""
    import sys

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            torch = None
    if torch is not None:
        torch.manual_seed(seed)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.manual_seed_all(seed)
    return seed


def _seed_worker(actor: Any, seed: int, position: int) -> tuple[int, int]:
    rank = runtime.get_rank()
    rank = position if rank is None else rank
    return rank, seed_everything(seed + rank)


def set_random_seed(seed: int, workers: list[Any] | None = None, *, timeout: float = 60) -> SeedReport:
    """Seed python/numpy/torch here (``seed``) and on every worker actor (``seed + rank``).

    ``workers``: actor handles; a worker's rank is its own (``rs.set_rank``,
    ``RANK``...) else its position in the list. Workers that fail are listed
    in ``errors`` (the others are still seeded).
    """
    report = SeedReport(seed=seed, driver_seed=seed_everything(seed))
    if workers:
        import ray

        refs = [ray_call(handle, functools.partial(_seed_worker, seed=seed, position=position))
                for position, handle in enumerate(workers)]
        deadline = time.monotonic() + timeout
        for position, ref in enumerate(refs):
            try:
                rank, worker_seed = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
                report.worker_seeds[rank] = worker_seed
            except Exception as error:
                report.errors[position] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return report
