"""``inspect_distributed_tensor``: one tensor across ranks — layout, stats, checksum."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from raysleuth import runtime
from raysleuth.consistency.checks import resolve_rank
from raysleuth.consistency.exchange import open_exchange
from raysleuth.fingerprints import TensorStats, fingerprint

__all__ = ["ShardInfo", "TensorInspection", "inspect_distributed_tensor"]

log = logging.getLogger("raysleuth.consistency")


@dataclass
class ShardInfo:
    """The part of the tensor one rank holds."""

    rank: int
    node_ip: str | None
    shape: list[int]
    checksum: str
    offset: int | None = None
    """First index along ``shard_dim`` (sharded tensors)."""
    length: int | None = None
    percent: float | None = None


@dataclass
class TensorInspection:
    """What :func:`inspect_distributed_tensor` found, the same on every rank."""

    name: str
    shape: list[int]
    """The global shape (local shape when replicated)."""
    dtype: str
    device: str
    rank: int
    world_size: int
    layout: str
    """``replicated`` | ``sharded`` | ``local`` (one rank)."""
    shard_dim: int | None
    placements: str | None
    stats: TensorStats | None
    checksum: str
    consistent: bool | None
    """Replicated: all ranks bitwise equal. Sharded: shards cover the tensor exactly once."""
    differing_ranks: list[int] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)
    shards: list[ShardInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    def lines(self) -> list[str]:
        """Human-readable lines (what ``print_details`` logs)."""
        out = [f"tensor {self.name}: shape {tuple(self.shape)}, dtype {self.dtype}, {self.layout} "
               f"over {self.world_size} rank(s)" + (f", placements {self.placements}" if self.placements else "")]
        for shard in self.shards:
            where = f"rank {shard.rank} ({shard.node_ip or '?'}): local shape {tuple(shard.shape)}"
            if shard.offset is not None:
                where += (f", dim {self.shard_dim} [{shard.offset}:{shard.offset + (shard.length or 0)}] "
                          f"= {shard.percent:.1f}%")
            out.append(f"  {where}, checksum {shard.checksum}")
        if self.stats:
            s = self.stats
            out.append(f"  stats (rank {self.rank}): min {s.min}, max {s.max}, mean {s.mean}, std {s.std}, "
                       f"NaN {s.nan_count}, Inf {s.inf_count}")
        if self.layout == "replicated":
            verdict = ("consistent across nodes" if self.consistent
                       else f"DIFFERS on rank(s) {self.differing_ranks}")
            out.append(f"  checksum {self.checksum}: {verdict}")
        elif self.layout == "sharded":
            out.append("  shards cover the tensor exactly once" if self.consistent
                       else "  shards do NOT cover the tensor exactly once (gap, overlap or shape disagreement)")
        if self.missing_ranks:
            out.append(f"  rank(s) {self.missing_ranks} did not answer")
        out.extend(f"  note: {note}" for note in self.notes)
        return out


def _dtensor_layout(tensor: Any) -> tuple[Any, int | None, str | None, list[int] | None]:
    """(local tensor, shard dim, placements, global shape) of a DTensor, else the tensor itself."""
    if type(tensor).__name__ != "DTensor" or not hasattr(tensor, "to_local"):
        return tensor, None, None, None
    shard_dim = None
    for placement in tensor.placements:
        if hasattr(placement, "dim") and placement.is_shard():
            shard_dim = placement.dim
    return tensor.to_local(), shard_dim, str(tuple(tensor.placements)), list(tensor.shape)


def inspect_distributed_tensor(
    tensor: Any,
    name: str = "tensor",
    print_details: bool = True,
    *,
    shard_dim: int | None = None,
    offset: int | None = None,
    key: str | None = None,
    timeout: float = 60,
    rank: int | None = None,
    world_size: int | None = None,
) -> TensorInspection:
    """Call on every rank: shape, dtype, per-rank shard layout, stats and checksum of one tensor.

    Replicated tensors: the checksum is compared ("consistent across nodes" or
    the ranks that differ). Sharded tensors (a DTensor with a ``Shard``
    placement, or ``shard_dim=`` with this rank's ``offset=``, default: the
    shards in rank order): which slice each rank holds and its share. With
    ``print_details`` the lines go to the ``raysleuth.consistency`` logger.
    """
    started = time.monotonic()
    local, dt_dim, placements, global_shape = _dtensor_layout(tensor)
    shard_dim = dt_dim if shard_dim is None else shard_dim
    fp = fingerprint(local, name=name, stats=True)
    try:
        rank, world_size = resolve_rank(rank, world_size)
    except Exception:
        rank, world_size = 0, 1
    mine: dict[str, Any] = {"checksum": fp.digest, "shape": list(fp.shape), "dtype": fp.dtype, "offset": offset,
            "node_ip": runtime.whoami().node_ip}
    result = TensorInspection(name=name, shape=list(fp.shape), dtype=fp.dtype, device=fp.device, rank=rank,
                              world_size=world_size, layout="local", shard_dim=shard_dim, placements=placements,
                              stats=fp.stats, checksum=fp.digest, consistent=True)
    posted = {rank: mine}
    try:
        exchange = open_exchange(key or f"inspect/{name}", runtime.current_step(), rank, world_size, timeout)
        posted = exchange.round("inspect", mine, expected=list(range(world_size)))
        exchange.close(sorted(posted), complete=len(posted) == world_size)
    except Exception as error:
        result.notes.append(f"could not meet the other ranks: {type(error).__name__}: {error}")
    result.missing_ranks = [r for r in range(world_size) if r not in posted]
    if world_size > 1:
        result.layout = "sharded" if shard_dim is not None else "replicated"
    if result.layout == "sharded" and shard_dim is not None:  # sharded means shard_dim is set
        _fill_shards(result, posted, shard_dim, global_shape)
    else:
        groups: dict[str, list[int]] = {}
        for r in sorted(posted):
            groups.setdefault(posted[r]["checksum"], []).append(r)
        reference = max(groups.values(), key=lambda ranks: (len(ranks), -ranks[0]))
        result.differing_ranks = sorted(r for r in posted if r not in reference)
        result.consistent = not result.differing_ranks and not result.missing_ranks
        result.shards = [ShardInfo(r, posted[r]["node_ip"], posted[r]["shape"], posted[r]["checksum"])
                         for r in sorted(posted)]
    result.seconds = round(time.monotonic() - started, 4)
    if print_details:
        for line in result.lines():
            log.info(line)
    return result


def _fill_shards(result: TensorInspection, posted: dict[int, dict], dim: int, global_shape: list[int] | None) -> None:
    position = 0
    for r in sorted(posted):
        entry = posted[r]
        length = entry["shape"][dim] if dim < len(entry["shape"]) else 0
        start = entry["offset"] if entry["offset"] is not None else position
        position = start + length
        result.shards.append(ShardInfo(r, entry["node_ip"], entry["shape"], entry["checksum"], start, length))
    if global_shape is None:
        global_shape = list(result.shape)
        if dim < len(global_shape):
            global_shape[dim] = max((s.offset or 0) + (s.length or 0) for s in result.shards)
    result.shape = global_shape
    total = global_shape[dim] if dim < len(global_shape) else 0
    for shard in result.shards:
        shard.percent = 100.0 * (shard.length or 0) / total if total else 0.0
    covered = sorted(((s.offset or 0), (s.offset or 0) + (s.length or 0)) for s in result.shards)
    exact = bool(covered) and covered[0][0] == 0 and covered[-1][1] == total
    exact = exact and all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    others = {tuple(x for i, x in enumerate(posted[r]["shape"]) if i != dim) for r in posted}
    result.consistent = exact and len(others) == 1 and not result.missing_ranks
