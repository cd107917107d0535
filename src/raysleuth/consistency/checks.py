"""The checks every rank calls: fingerprint, meet, compare, localise, report, store.

One engine (:func:`check_distributed_consistency`) and thin faces over it
(:func:`verify_distributed_tensors`, :func:`check_gradient_sync`,
:func:`check_data_consistency`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from raysleuth import runtime
from raysleuth.consistency.exchange import Exchange, open_exchange
from raysleuth.consistency.report import ConsistencyReport, algorithms_of, compare_fingerprints, localize
from raysleuth.errors import UsageError
from raysleuth.fingerprints import Fingerprint, chunk_bytes, fingerprint, named_items
from raysleuth.recorder import record as store

__all__ = [
    "check_data_consistency",
    "check_distributed_consistency",
    "check_gradient_sync",
    "resolve_rank",
    "verify_distributed_tensors",
]

log = logging.getLogger("raysleuth.consistency")
_ERROR = "__raysleuth_error__"


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's rank and world size: the arguments, else the runtime's."""
    rank = runtime.get_rank() if rank is None else rank
    world_size = runtime.get_world_size() if world_size is None else world_size
    if rank is None:
        raise UsageError("this process has no rank, so it cannot take part in a consistency check",
                         fix="call rs.set_rank(rank, world_size), set RANK/WORLD_SIZE, or pass rank=..., world_size=...")
    if world_size is None:
        raise UsageError(f"rank {rank} has no world size", fix="pass world_size=... or rs.set_rank(rank, world_size)")
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside world size {world_size}")
    return rank, world_size


def check_distributed_consistency(
    named_tensors: Any,
    key: str = "params",
    step: int | None = None,
    timeout: float = 60,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    transport: str = "auto",
    rank: int | None = None,
    world_size: int | None = None,
    record: bool = True,
) -> ConsistencyReport:
    """Call on every rank: are these tensors the same everywhere? If not: which, where, on whom.

    ``named_tensors``: a dict, ``model.named_parameters()``, ``model.parameters()``
    (named ``param_0``...), or a module. Every rank fingerprints its tensors on
    their device, the ranks meet (the evidence writer's mailboxes, else
    ``torch.distributed``), and every rank gets the same report: per tensor
    that differs, its name, kind (value | shape | dtype | missing), the groups
    of agreeing ranks, the outlier ranks and the index of the first differing
    element. With ``atol``/``rtol`` bit differences within
    ``atol + rtol*|reference|`` are accepted and max abs/rel diffs reported.
    A rank that does not arrive within ``timeout`` seconds is reported missing.
    The report is logged (warning on mismatch) and stored as kind ``consistency``.
    """
    started = time.monotonic()
    items = named_items(named_tensors)
    rank, world_size = resolve_rank(rank, world_size)
    step = runtime.current_step() if step is None else step
    tolerance = atol > 0 or rtol > 0
    report = ConsistencyReport(key=key, consistent=False, world_size=world_size, step=step, rank=rank,
                               timeout=timeout, atol=atol, rtol=rtol, tensors_checked=len(items))
    try:
        exchange = open_exchange(key, step, rank, world_size, timeout, transport)
    except UsageError as error:
        report.error = error.message + (f": {error.fix}" if error.fix else "")
        return _finish(report, started, record)
    report.transport = exchange.name
    try:
        mine = {name: fingerprint(value, name=name, stats=tolerance) for name, value in items}
    except TypeError as error:
        _post_error(exchange, f"rank {rank}: {error}")
        raise
    tensors = dict(items)
    try:
        _meet(exchange, report, mine, tensors, atol, rtol)
    except Exception as error:  # never take the step down: say why the check could not finish
        log.debug("consistency check %r failed", key, exc_info=True)
        report.error = f"{type(error).__name__}: {error}"
    return _finish(report, started, record)


def _signature(fp: Fingerprint) -> str:
    """What two ranks' prints of a tensor must share to be equal without comparing them further."""
    return f"{fp.algorithm}/{fp.chunk_elems}/{fp.dtype}/{list(fp.shape)}/{fp.digest}"


def _post_error(exchange: Exchange, message: str) -> None:
    try:
        # tell the peers at once (they list this rank as missing, with the reason) instead of
        # letting them wait out the timeout; the topics stay for them to read
        exchange.round("fp", {_ERROR: message}, expected=[exchange.rank])
    except Exception:
        pass


def _meet(exchange: Exchange, report: ConsistencyReport, mine: dict[str, Fingerprint],
          tensors: dict[str, Any], atol: float, rtol: float) -> None:
    world = list(range(report.world_size))
    # the tensors every rank signs alike (same digest, dtype, shape, algorithm) need no one's digests
    posted, agreed = exchange.round_agreed("fp", mine, {name: _signature(fp) for name, fp in mine.items()},
                                           expected=world)
    for rank, value in sorted(posted.items()):
        if _ERROR in value:
            report.notes.append(str(value[_ERROR]))
            del posted[rank]
    report.arrived_ranks = sorted(posted)
    report.missing_ranks = [rank for rank in world if rank not in posted]
    report.tensors_checked = len(agreed | {name for fps in posted.values() for name in fps})
    if report.rank not in posted:  # only possible if our own post was lost
        raise RuntimeError("this rank's own fingerprints did not reach the mailbox")
    mismatches, requests, rehash = compare_fingerprints(posted)
    if rehash:
        # CPU (xxh3) and CUDA (mix64) ranks hold the same tensor: compare mix64 digests.
        again = {name: fingerprint(tensors[name], name=name, stats=atol > 0 or rtol > 0, algorithm="mix64")
                 for name in rehash if name in tensors}
        redo = exchange.round("rehash", again, expected=report.arrived_ranks)
        for rank, fps in redo.items():
            posted[rank].update(fps)
        mismatches, requests, still = compare_fingerprints(posted)
        for name in still:  # a rank's mix64 rehash did not arrive: say so, never count it consistent
            report.incomparable.append(name)
            report.notes.append(f"{name}: not compared, digests differ in algorithm ({algorithms_of(posted, name)})")
    if requests:
        wanted = [request for request in requests if request.rank == report.rank]
        payload = {(r.name, r.chunk): chunk_bytes(tensors[r.name], posted[report.rank][r.name], r.chunk)
                   for r in wanted}
        payloads = exchange.round("chunks", payload, expected=report.arrived_ranks)
        for mismatch in list(mismatches):
            if mismatch.kind == "value" and localize(mismatch, posted, payloads, atol=atol, rtol=rtol):
                mismatches.remove(mismatch)
                report.within_tolerance.append(mismatch.name)
    exchange.close(report.arrived_ranks, complete=not report.missing_ranks)
    report.mismatches = mismatches


def _finish(report: ConsistencyReport, started: float, record: bool) -> ConsistencyReport:
    report.settle()
    report.seconds = round(time.monotonic() - started, 4)
    if report.consistent:
        log.info(report.summary())
    else:
        log.warning(report.summary())
    reporter = min(report.arrived_ranks) if report.arrived_ranks else report.rank
    if record and report.rank == reporter:
        try:
            store("consistency", report.to_dict(), name=report.key, step=report.step, level=report.level)
        except Exception:  # the recorder never blocks or raises, but be sure
            log.debug("could not record consistency report", exc_info=True)
    return report


def verify_distributed_tensors(
    tensor_dict: Any,
    tolerance: float = 1e-6,
    operation_name: str = "verify",
    *,
    step: int | None = None,
    timeout: float = 60,
    **options: Any,
) -> ConsistencyReport:
    """Call on every rank: the same check with a numeric tolerance (``atol = rtol = tolerance``).

    Tensors whose bits differ but whose every element is within
    ``tolerance + tolerance*|reference|`` are listed in ``within_tolerance``;
    the others are mismatches with their max abs/rel difference.
    """
    return check_distributed_consistency(tensor_dict, key=operation_name, step=step, timeout=timeout,
                                         atol=tolerance, rtol=tolerance, **options)


def check_gradient_sync(
    parameters: Any,
    key: str = "gradients",
    step: int | None = None,
    timeout: float = 60,
    **options: Any,
) -> ConsistencyReport:
    """Call on every rank after backward (and the all-reduce): are the ``.grad`` tensors identical?

    Accepts ``model.parameters()``, ``model.named_parameters()``, a module or a
    dict of parameters; parameters without a gradient are left out (a gradient
    present on some ranks only is reported as ``missing``).
    """
    grads = {}
    for name, parameter in named_items(parameters):
        grad = getattr(parameter, "grad", None)
        if grad is not None:
            grads[name] = grad
    return check_distributed_consistency(grads, key=key, step=step, timeout=timeout, **options)


# ---------------------------------------------------------------- data


def _as_array(sample: Any) -> Any:
    if isinstance(sample, str):
        sample = sample.encode()
    if isinstance(sample, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(sample), np.uint8)
    if isinstance(sample, (int, float, bool, complex)):
        return np.asarray(sample)
    return sample


def _default_loader(path: Path) -> Callable[[int], Any]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        return lambda index: files[index].read_bytes()
    if path.suffix == ".npy":
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        return lambda index: np.array(array[index])
    lines: list[bytes] = []

    def line(index: int) -> bytes:
        if index < 0:
            raise IndexError(index)
        if len(lines) <= index:
            with open(path, "rb") as handle:
                lines[:] = [row for _, row in zip(range(index + 1), handle)]
        return lines[index]

    return line


def check_data_consistency(
    dataset_path: str | Path,
    sample_indices: list[int] | tuple[int, ...] = (0,),
    *,
    loader: Callable[[str, int], Any] | None = None,
    key: str = "data",
    step: int | None = None,
    timeout: float = 60,
    **options: Any,
) -> ConsistencyReport:
    """Call on every rank: does every rank see the same bytes for these samples?

    Each rank loads ``sample_indices`` from ``dataset_path`` (``loader(path, i)``
    if given; else a ``.npy`` row, the i-th file of a directory, or the i-th
    line of any other file) and compares: a missing path (``exists`` differs),
    a different file (``size``, samples differ) or different preprocessing
    (samples differ) is reported with the ranks concerned.
    """
    path = Path(dataset_path).expanduser()
    entries: dict[str, Any] = {"exists": np.bool_(path.exists())}
    notes: list[str] = []
    if path.exists():
        entries["size"] = np.int64(path.stat().st_size if path.is_file() else
                                   sum(p.stat().st_size for p in path.rglob("*") if p.is_file()))
        load = (lambda index: loader(str(path), index)) if loader else _default_loader(path)
        for index in sample_indices:
            try:
                entries[f"sample[{index}]"] = _as_array(load(index))
            except (IndexError, KeyError) as error:
                notes.append(f"sample {index} not found: {error!r}")
    report = check_distributed_consistency(entries, key=key, step=step, timeout=timeout, **options)
    report.notes.extend(notes)
    return report
