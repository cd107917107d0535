"""Pure logic: did each sync arrive as it was sent? Prints in, :class:`SyncCheck` out.

A sync is one version. Its sent side is the union of what every sending
rank sent (keyed by name and shard); each receiving process must have
received all of it. Per receiver, by key:

- ``missing``: sent, never received; ``extra``: received, never sent;
- ``shape`` / ``dtype``: reported as such. Floats of different precision
  are compared at the lower one when the sender recorded that digest
  (``canonical=``), and are a ``cast`` (not a difference) when equal there;
- ``value``: the digests differ; the first differing chunk names the flat
  element range.

A sync whose differing tensors all equal the previous version's is
``stale``: the rollout side kept the old weights, the sync did nothing.
Records written by :func:`raysleuth.check_weight_sync` (side ``loaded``)
add what the engine really loaded, per tensor-parallel shard.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth.weights.prints import WeightPrint, lower_precision

__all__ = ["SideRecord", "SyncCheck", "TensorDiff", "compare_syncs", "compare_version"]


@dataclasses.dataclass(kw_only=True)
class TensorDiff:
    """One tensor that did not arrive (or load) as it was sent."""

    name: str
    kind: str
    """``value``, ``dtype``, ``shape``, ``missing``, ``extra``, ``incomparable``, ``missing_shard``."""
    detail: str
    shard: int | None = None
    stage: str = "transit"
    """``transit`` (sent vs received) or ``load`` (what the engine holds after loading)."""
    element_range: list[int] | None = None
    """Flat elements ``[start, stop)`` of the first differing chunk (``value``)."""
    differing_chunks: int | None = None
    sender_rank: int | None = None
    receiver_rank: int | None = None
    receiver_pid: int | None = None
    stale: bool = False
    """The received tensor equals what the previous version sent."""

    def describe(self) -> str:
        """One line: which tensor, which shard, what, where."""
        shard = f" shard {self.shard}" if self.shard is not None else ""
        where = f" elements {self.element_range[0]}-{self.element_range[1]}" if self.element_range else ""
        ranks = f" (sender rank {_r(self.sender_rank)} -> receiver rank {_r(self.receiver_rank)})" \
            if self.stage == "transit" else (f" (rank {_r(self.receiver_rank)})" if self.receiver_rank is not None else "")
        return f"{self.name}{shard}: {self.kind}{where}: {self.detail}{ranks}"


def _r(rank: int | None) -> str:
    return "?" if rank is None else str(rank)


@dataclasses.dataclass(kw_only=True)
class SideRecord:
    """One process's side of one sync, as stored."""

    side: str
    version: int
    rank: int | None = None
    pid: int | None = None
    source: str = "api"
    complete: bool = True
    error: str | None = None
    prints: dict[tuple[str, int | None], WeightPrint] = dataclasses.field(default_factory=dict)
    time: float | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    """A ``loaded`` record's check result (its diffs, shard, tp_size...)."""

    @classmethod
    def from_data(cls, data: dict[str, Any], *, time_: float | None = None, rank: int | None = None,
                  pid: int | None = None) -> "SideRecord":
        """From a ``weight_sync`` record's data; raises TypeError/ValueError when it is not one."""
        if not isinstance(data, dict) or data.get("side") not in ("sent", "received", "loaded"):
            raise ValueError("not a weight_sync side")
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError("weight_sync without a version")
        prints = {}
        for item in data.get("tensors") or []:
            one = WeightPrint.from_dict(item)
            prints[one.key] = one
        own_rank = data.get("rank", rank)
        return cls(side=data["side"], version=version, rank=own_rank if isinstance(own_rank, int) else rank,
                   pid=data.get("pid", pid) if isinstance(data.get("pid", pid), int) else pid,
                   source=str(data.get("source", "api")), complete=bool(data.get("complete", True)),
                   error=data.get("error") if isinstance(data.get("error"), str) else None, prints=prints,
                   time=time_, extra={k: v for k, v in data.items() if k in ("check", "tp_size", "shard")})


@dataclasses.dataclass(kw_only=True)
class SyncCheck:
    """The verdict on one sync (one version)."""

    version: int
    status: str
    """``intact``, ``differs``, ``stale``, ``unreceived`` (sent, no receiver recorded), ``unsent`` (received,
    no sender recorded), ``incomplete`` (a side's stream did not run to its end)."""
    sent: int = 0
    received: list[int] = dataclasses.field(default_factory=list)
    """Tensors each receiving process got, in the order of ``receiver_ranks``."""
    sender_ranks: list[int | None] = dataclasses.field(default_factory=list)
    receiver_ranks: list[int | None] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)
    extra: list[str] = dataclasses.field(default_factory=list)
    diffs: list[TensorDiff] = dataclasses.field(default_factory=list)
    casts: list[str] = dataclasses.field(default_factory=list)
    """Tensors that differ only by a float cast (compared at the lower precision: equal)."""
    loaded: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Checks of what the engine loaded (``rs.check_weight_sync``): shard, tp_size, checked, intact."""
    stale: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)
    time: float | None = None

    @property
    def intact(self) -> bool:
        return self.status == "intact"

    @property
    def first_diff(self) -> TensorDiff | None:
        return self.diffs[0] if self.diffs else None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["intact"] = self.intact
        return data


def _label(key: tuple[str, int | None]) -> str:
    return key[0] if key[1] is None else f"{key[0]} [shard {key[1]}]"


def _compare_pair(sent: WeightPrint, got: WeightPrint) -> tuple[str | None, str, list[int] | None, int | None]:
    """(kind or None when equal, detail, element range, differing chunks); ``cast`` when equal after a cast."""
    if list(sent.shape) != list(got.shape):
        return "shape", f"sent {sent.dtype}{list(sent.shape)}, received {got.dtype}{list(got.shape)}", None, None
    sent_digest, sent_chunks, sent_elems, cast = sent.digest, sent.chunks, sent.chunk_elems, False
    if sent.dtype != got.dtype:
        lower = lower_precision(sent.dtype, got.dtype)
        if lower is None or lower != got.dtype or not sent.canonical or sent.canonical.get("dtype") != lower:
            how = (f"a cast to the lower precision {lower}; digest the sender at it too (canonical={lower!r}) "
                   "to compare values") if lower else "not a float cast"
            return "dtype", f"sent {sent.dtype}, received {got.dtype} ({how})", None, None
        sent_digest, sent_chunks = sent.canonical["digest"], sent.canonical.get("chunks") or []
        sent_elems, cast = int(sent.canonical.get("chunk_elems", got.chunk_elems)), True
    if sent.algorithm != got.algorithm:
        return "incomparable", (f"digested with {sent.algorithm} by the sender, {got.algorithm} by the receiver "
                                "(a CPU and a CUDA side: pass algorithm='wsum' on both)"), None, None
    if sent_digest == got.digest:
        return ("cast" if cast else None), f"equal at {got.dtype}" if cast else "", None, None
    differing = [i for i, (a, b) in enumerate(zip(sent_chunks, got.chunks)) if a != b]
    differing += list(range(min(len(sent_chunks), len(got.chunks)), max(len(sent_chunks), len(got.chunks))))
    first = differing[0] if differing else 0
    at = f" after casting to {got.dtype}" if cast else ""
    return "value", f"{len(differing)} of {len(got.chunks)} chunks differ{at}", \
        got.element_range(first, sent_elems), len(differing)


def _compare_receiver(check: SyncCheck, sent: dict, receiver: SideRecord, previous: dict | None) -> None:
    got = receiver.prints
    for key in sent:
        if key not in got:
            check.missing.append(_label(key))
            check.diffs.append(TensorDiff(name=key[0], shard=key[1], kind="missing", detail="sent, never received",
                                          sender_rank=sent[key][1], receiver_rank=receiver.rank,
                                          receiver_pid=receiver.pid))
    for key, print_ in got.items():
        if key not in sent:
            check.extra.append(_label(key))
            check.diffs.append(TensorDiff(name=key[0], shard=key[1], kind="extra", detail="received, never sent",
                                          receiver_rank=receiver.rank, receiver_pid=receiver.pid))
            continue
        kind, detail, element_range, chunks = _compare_pair(sent[key][0], print_)
        if kind == "cast":
            check.casts.append(_label(key))
        elif kind is not None:
            old = previous.get(key) if previous else None
            stale = kind == "value" and old is not None and old[0].digest == print_.digest
            check.diffs.append(TensorDiff(
                name=key[0], shard=key[1], kind=kind, detail=detail + ("; equals the previous version" if stale else ""),
                element_range=element_range, differing_chunks=chunks, sender_rank=sent[key][1],
                receiver_rank=receiver.rank, receiver_pid=receiver.pid, stale=stale))


def _sent_union(senders: list[SideRecord]) -> dict[tuple[str, int | None], tuple[WeightPrint, int | None]]:
    union: dict = {}
    for sender in senders:
        for key, print_ in sender.prints.items():
            union.setdefault(key, (print_, sender.rank))
    return union


def _add_loaded(check: SyncCheck, loaded: list[SideRecord]) -> None:
    seen_shards: dict[int, set[int]] = {}
    for record in loaded:
        result = record.extra.get("check") or {}
        shard, tp_size = record.extra.get("shard"), record.extra.get("tp_size") or 1
        check.loaded.append({"shard": shard, "tp_size": tp_size, "rank": record.rank,
                             "checked": result.get("checked", 0), "intact": bool(result.get("intact"))})
        if isinstance(shard, int) and isinstance(tp_size, int):
            seen_shards.setdefault(tp_size, set()).add(shard)
        for item in result.get("diffs") or []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                fields = {f.name for f in dataclasses.fields(TensorDiff)}
                diff = TensorDiff(**{k: v for k, v in item.items() if k in fields})
                diff.stage, diff.receiver_rank = "load", record.rank
                check.diffs.append(diff)
        check.casts.extend(f"{name} (loaded)" for name in result.get("casts") or [])
    for tp_size, shards in seen_shards.items():
        for shard in sorted(set(range(tp_size)) - shards):
            check.diffs.append(TensorDiff(name="(every tensor)", shard=shard, kind="missing_shard", stage="load",
                                          detail=f"no load check from shard {shard} of {tp_size}: that "
                                                 "tensor-parallel rank never reported what it loaded"))


def compare_version(version: int, senders: list[SideRecord], receivers: list[SideRecord],
                    loaded: list[SideRecord] | None = None,
                    previous_sent: list[SideRecord] | None = None) -> SyncCheck:
    """The verdict on one version from its sides (``previous_sent``: the sides of the version before)."""
    sent = _sent_union(senders)
    check = SyncCheck(version=version, status="intact", sent=len(sent),
                      sender_ranks=sorted({s.rank for s in senders}, key=lambda r: (r is None, r or 0)),
                      receiver_ranks=[r.rank for r in receivers], received=[len(r.prints) for r in receivers])
    times = [s.time for s in senders + receivers if s.time is not None]
    check.time = min(times) if times else None
    previous = _sent_union(previous_sent or [])
    for receiver in receivers:
        if senders:
            _compare_receiver(check, sent, receiver, previous)
    _add_loaded(check, loaded or [])
    for side in senders + receivers:
        if side.error:
            check.notes.append(f"{side.side} by rank {_r(side.rank)} (pid {side.pid}): {side.error}")
    value_diffs = [d for d in check.diffs if d.kind == "value" and d.stage == "transit"]
    check.stale = bool(value_diffs) and all(d.stale for d in value_diffs)
    if check.diffs:
        check.status = "stale" if check.stale and len(value_diffs) == len(check.diffs) else "differs"
    elif not receivers and senders and not loaded:
        check.status = "unreceived"
        check.notes.append("sent, but no receiving side recorded this version: the rollout side never received it, "
                           "or it is not instrumented (rs.weights_received / the verl hook)")
    elif not senders and (receivers or loaded):
        if receivers:
            check.status = "unsent"
            check.notes.append("received, but no sending side recorded this version: instrument the trainer "
                               "(rs.weights_sent / the verl hook) to compare")
    elif any(not side.complete for side in senders + receivers):
        check.status = "incomplete"
        check.notes.append("a side's stream stopped before its end (closed early or raised)")
    return check


def compare_syncs(sides: list[SideRecord]) -> list[SyncCheck]:
    """Every version's verdict, oldest first."""
    by_version: dict[int, dict[str, list[SideRecord]]] = {}
    for side in sides:
        by_version.setdefault(side.version, {"sent": [], "received": [], "loaded": []})[side.side].append(side)
    checks, previous = [], None
    for version in sorted(by_version):
        group = by_version[version]
        checks.append(compare_version(version, group["sent"], group["received"], group["loaded"], previous))
        if group["sent"]:
            previous = group["sent"]
    return checks
