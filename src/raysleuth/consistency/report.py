"""The consistency report and the pure logic that fills it.

Input: the fingerprints every rank posted (``{rank: {name: Fingerprint}}``)
and, in a second step, the raw bytes of the chunks that disagree. Output: a
:class:`ConsistencyReport`. No Ray, no torch.distributed here: every rank
runs this same code on the same posted data and so reaches the same report.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from raysleuth.fingerprints import Fingerprint, decode_values, first_difference

__all__ = ["ChunkRequest", "ConsistencyReport", "Mismatch", "algorithms_of", "compare_fingerprints", "localize"]

MAX_EXCHANGE_BYTES = 64 * 1024 * 1024
"""Chunk bytes one check may ship in total to localise differences (per sender)."""


@dataclass
class Mismatch:
    """One tensor that is not the same on every rank."""

    name: str
    kind: str
    """``value`` | ``shape`` | ``dtype`` | ``missing``."""
    groups: list[list[int]]
    """Ranks that agree with each other, largest group first."""
    outlier_ranks: list[int]
    """Ranks outside the largest group; empty when the mismatch is :attr:`ambiguous`."""
    reference_rank: int | None = None
    first_index: list[int] | None = None
    """Index (one entry per dimension) of the first element that differs."""
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    diff_exact: bool = False
    """True when the diffs cover every differing chunk (else: the chunks shipped within budget)."""
    differing_chunks: int = 0
    values: dict[str, str] = field(default_factory=dict)
    """Rank -> the value it holds at ``first_index`` (one rank per group)."""
    detail: str = ""
    ambiguous: bool = False
    """The largest groups are of one size (2 ranks, an even split): no rank is named as the outlier."""

    def describe(self) -> str:
        """One line for logs and the CLI."""
        if self.ambiguous:
            text = f"{self.name}: {self.kind} differs, ambiguous: ranks " + " vs ".join(map(str, self.groups))
        else:
            text = f"{self.name}: {self.kind} differs on rank(s) {self.outlier_ranks}"
        if self.first_index is not None:
            text += f", first at index {tuple(self.first_index)}"
        if self.max_abs_diff is not None:
            text += f", max abs diff {self.max_abs_diff:.3g}, max rel diff {self.max_rel_diff:.3g}"
        if self.detail:
            text += f" ({self.detail})"
        return text


@dataclass
class ConsistencyReport:
    """The verdict of one consistency check; every rank gets the same one."""

    key: str
    consistent: bool
    world_size: int
    step: int | None = None
    rank: int | None = None
    """The rank this copy of the report was produced on (``None`` on the driver)."""
    tensors_checked: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    within_tolerance: list[str] = field(default_factory=list)
    """Tensors whose bits differ but whose values are within ``atol``/``rtol``."""
    arrived_ranks: list[int] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)
    """Ranks that never posted within ``timeout`` seconds (not waited on further)."""
    timeout: float | None = None
    atol: float = 0.0
    rtol: float = 0.0
    transport: str = "store"
    seconds: float = 0.0
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    incomparable: list[str] = field(default_factory=list)
    """Tensors whose ranks' digests use different algorithms (xxh3/blake2b/mix64) and could not be
    rehashed alike: not compared, so the check cannot say they are consistent."""
    nothing_compared: bool = False
    """No rank that arrived posted a tensor (``check_gradient_sync`` before ``backward()``,
    parameters without ``.grad``, an exhausted generator): a warning, never consistent."""

    @property
    def level(self) -> str:
        """The record level: ``INFO`` consistent, ``WARNING`` when nothing was compared, else ``ERROR``."""
        return "INFO" if self.consistent else ("WARNING" if self.nothing_compared else "ERROR")

    def settle(self) -> None:
        """Set :attr:`consistent` (and :attr:`nothing_compared`) from what the check found."""
        self.nothing_compared = (self.error is None and not self.mismatches and not self.incomparable
                                 and not self.missing_ranks and self.tensors_checked == 0)
        self.consistent = (not self.mismatches and not self.missing_ranks and not self.incomparable
                           and self.error is None and not self.nothing_compared)

    @property
    def outlier_ranks(self) -> list[int]:
        """Every rank blamed by some mismatch, plus ranks that never arrived."""
        ranks = {rank for mismatch in self.mismatches for rank in mismatch.outlier_ranks}
        return sorted(ranks | set(self.missing_ranks))

    def summary(self) -> str:
        """One line: the verdict and the first few culprits."""
        if self.error:
            return f"consistency check {self.key!r} could not run: {self.error}"
        if self.nothing_compared:
            return (f"consistency check {self.key!r} NOTHING COMPARED: no rank of {self.world_size} posted a tensor "
                    "(a gradient check before backward(), parameters without .grad, an exhausted generator?): "
                    "pass the tensors to compare")
        if self.consistent:
            extra = f" ({len(self.within_tolerance)} within tolerance)" if self.within_tolerance else ""
            return (f"consistency check {self.key!r}: {self.tensors_checked} tensors consistent across "
                    f"{self.world_size} ranks{extra}")
        parts = [mismatch.describe() for mismatch in self.mismatches[:5]]
        if len(self.mismatches) > 5:
            parts.append(f"... {len(self.mismatches) - 5} more")
        if self.incomparable:
            parts.append(f"incomparable (digest algorithms differ between ranks, not compared): "
                         f"{self.incomparable[:5]}")
            if not self.mismatches and not self.missing_ranks:
                return f"consistency check {self.key!r} INCOMPARABLE: " + "; ".join(parts)
        if self.missing_ranks:
            parts.append(f"rank(s) {self.missing_ranks} did not arrive within {self.timeout}s")
        return f"consistency check {self.key!r} MISMATCH: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (what is stored as evidence)."""
        data = asdict(self)
        data["outlier_ranks"] = self.outlier_ranks
        return _finite(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ConsistencyReport":
        """Rebuild a report from :meth:`to_dict` output (the CLI reads stored checks)."""
        if not isinstance(data, dict) or not isinstance(data.get("key"), str) \
                or not isinstance(data.get("consistent"), bool) or not isinstance(data.get("world_size"), int):
            raise ValueError("not a stored consistency report (needs key, consistent, world_size)")
        data = dict(data)
        data.pop("outlier_ranks", None)
        for name in ("mismatches", "within_tolerance", "arrived_ranks", "missing_ranks", "notes"):
            if name in data and not isinstance(data[name], list):
                raise ValueError(f"not a stored consistency report ({name} is not a list)")
        if not isinstance(data.get("tensors_checked", 0), int):
            raise ValueError("not a stored consistency report (tensors_checked is not a number)")
        known = {f for f in cls.__dataclass_fields__}
        mismatches = [Mismatch(**{k: v for k, v in m.items() if k in Mismatch.__dataclass_fields__})
                      for m in data.get("mismatches", []) if isinstance(m, dict)]
        report = cls(**{k: v for k, v in data.items() if k in known and k != "mismatches"})
        report.mismatches = mismatches
        if report.consistent and report.tensors_checked == 0:  # stored before 0 tensors was a warning
            report.settle()
        return report


def _finite(value: Any) -> Any:
    """inf/nan floats to strings so the JSON is strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


@dataclass(frozen=True)
class ChunkRequest:
    """Rank ``rank`` should ship chunk ``chunk`` of tensor ``name``."""

    rank: int
    name: str
    chunk: int


def _groups(values: dict[int, Any]) -> list[list[int]]:
    """Ranks grouped by equal value; largest group first, ties by lowest rank."""
    by_value: dict[Any, list[int]] = defaultdict(list)
    for rank in sorted(values):
        by_value[values[rank]].append(rank)
    return sorted(by_value.values(), key=lambda ranks: (-len(ranks), ranks[0]))


def _blamed(name: str, kind: str, groups: list[list[int]], outliers: list[int], **fields: Any) -> Mismatch:
    """A mismatch naming ``outliers``, unless the largest groups tie: then ambiguous, naming no rank."""
    ambiguous = len(groups) > 1 and len(groups[0]) == len(groups[1])
    return Mismatch(name, kind, groups, [] if ambiguous else outliers, reference_rank=groups[0][0],
                    ambiguous=ambiguous, **fields)


def compare_fingerprints(
    posted: dict[int, dict[str, Fingerprint]],
    *,
    max_exchange_bytes: int = MAX_EXCHANGE_BYTES,
) -> tuple[list[Mismatch], list[ChunkRequest], list[str]]:
    """Compare what every rank posted.

    Returns the mismatches (values not yet localised), the chunks to fetch
    to localise value mismatches, and the names whose ranks used different
    digest algorithms (CPU and CUDA ranks: fingerprint those again with
    ``mix64``).
    """
    ranks = sorted(posted)
    names: list[str] = []
    for rank in ranks:
        names.extend(name for name in posted[rank] if name not in names)
    mismatches: list[Mismatch] = []
    requests: list[ChunkRequest] = []
    rehash: list[str] = []
    budget: dict[int, int] = defaultdict(int)
    for name in names:
        have = {rank: posted[rank][name] for rank in ranks if name in posted[rank]}
        if len(have) < len(ranks):
            groups = _groups({rank: name in posted[rank] for rank in ranks})
            absent = [rank for rank in ranks if rank not in have]
            present = sorted(have)
            outliers = absent if len(absent) <= len(present) else present
            mismatches.append(_blamed(name, "missing", groups, outliers, detail=f"absent on rank(s) {absent}"))
            if len(have) < 2:
                continue  # the ranks that have it are still compared with each other below
        for kind, attribute in (("dtype", "dtype"), ("shape", "shape")):
            groups = _groups({rank: getattr(fp, attribute) for rank, fp in have.items()})
            if len(groups) > 1:
                described = ", ".join(f"{getattr(have[g[0]], attribute)} on {g}" for g in groups)
                mismatches.append(_blamed(name, kind, groups, sorted(r for g in groups[1:] for r in g),
                                          detail=described))
                break
        else:
            if len({(fp.algorithm, fp.chunk_elems) for fp in have.values()}) > 1:
                rehash.append(name)
                continue
            groups = _groups({rank: fp.digest for rank, fp in have.items()})
            if len(groups) == 1:
                continue
            reference = groups[0][0]
            mismatch = _blamed(name, "value", groups, sorted(r for g in groups[1:] for r in g))
            ref_fp = have[reference]
            complete = True
            wanted: set[int] = set()
            for group in groups[1:]:
                chunks = ref_fp.differing_chunks(have[group[0]])
                mismatch.differing_chunks = max(mismatch.differing_chunks, len(chunks))
                for chunk in chunks:
                    start, stop = ref_fp.chunk_range(chunk)
                    size = (stop - start) * ref_fp.itemsize
                    if budget[group[0]] + size > max_exchange_bytes or budget[reference] + size > max_exchange_bytes:
                        complete = False
                        break
                    budget[group[0]] += size
                    requests.append(ChunkRequest(group[0], name, chunk))
                    if chunk not in wanted:
                        budget[reference] += size
                        wanted.add(chunk)
                        requests.append(ChunkRequest(reference, name, chunk))
            mismatch.diff_exact = complete
            mismatches.append(mismatch)
    return mismatches, requests, rehash


def algorithms_of(posted: dict[int, dict[str, Fingerprint]], name: str) -> str:
    """``xxh3 on [0, 1], mix64 on [2]``: which rank digested ``name`` how."""
    by_algorithm: dict[str, list[int]] = defaultdict(list)
    for rank in sorted(posted):
        if name in posted[rank]:
            by_algorithm[posted[rank][name].algorithm].append(rank)
    return ", ".join(f"{algorithm} on {ranks}" for algorithm, ranks in sorted(by_algorithm.items()))


def _format(value: Any) -> str:
    if isinstance(value, complex):
        return repr(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def localize(
    mismatch: Mismatch,
    posted: dict[int, dict[str, Fingerprint]],
    payloads: dict[int, dict[tuple[str, int], bytes]],
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
) -> bool:
    """Fill ``first_index``, diffs and values of a value mismatch from shipped chunks.

    Returns True when every differing element is within ``atol + rtol*|reference|``
    (only possible with a tolerance and every differing chunk shipped).
    """
    reference = mismatch.reference_rank if mismatch.reference_rank is not None else mismatch.groups[0][0]
    ref_fp = posted[reference][mismatch.name]
    first_flat: int | None = None
    max_abs = max_rel = 0.0
    within = mismatch.diff_exact
    numeric = True
    for group in mismatch.groups[1:]:
        other = group[0]
        other_fp = posted[other][mismatch.name]
        for chunk in ref_fp.differing_chunks(other_fp):
            mine = payloads.get(reference, {}).get((mismatch.name, chunk))
            theirs = payloads.get(other, {}).get((mismatch.name, chunk))
            if mine is None or theirs is None:
                within = False
                continue
            start, _ = ref_fp.chunk_range(chunk)
            offset = first_difference(mine, theirs, ref_fp.itemsize)
            if offset is not None and (first_flat is None or start + offset < first_flat):
                first_flat = start + offset
                mismatch.values = {}
            if offset is not None and first_flat == start + offset:
                for rank, raw in ((reference, mine), (other, theirs)):
                    mismatch.values[str(rank)] = _element(raw, offset, ref_fp)
            a = decode_values(mine, ref_fp.dtype)
            b = decode_values(theirs, ref_fp.dtype)
            if a is None or b is None:
                numeric = False
                within = False
                continue
            both_nan = np.isnan(a) & np.isnan(b)
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                diff = np.abs(b - a)
                diff[both_nan] = 0.0
                diff[np.isnan(diff)] = math.inf  # nan against a number, or inf - inf
                scale = np.abs(a)
                rel = np.where(diff == 0, 0.0, diff / np.where(scale == 0, 0.0, scale))
            rel[np.isnan(rel)] = math.inf
            if diff.size:
                max_abs = max(max_abs, float(diff.max()))
                max_rel = max(max_rel, float(rel.max()))
                if within and not bool(np.all(diff <= atol + rtol * scale)):
                    within = False
    if first_flat is not None:
        shape = tuple(ref_fp.shape)
        mismatch.first_index = [int(i) for i in np.unravel_index(first_flat, shape)] if shape else []
    if numeric:
        mismatch.max_abs_diff = max_abs
        mismatch.max_rel_diff = max_rel
    if not mismatch.diff_exact:
        mismatch.detail = (f"{mismatch.differing_chunks} chunks differ; diffs cover those shipped within "
                           f"{MAX_EXCHANGE_BYTES >> 20} MiB")
    return within and numeric and (atol > 0 or rtol > 0)


def _element(raw: bytes, offset: int, fp: Fingerprint) -> str:
    item = raw[offset * fp.itemsize:(offset + 1) * fp.itemsize]
    values = decode_values(item, fp.dtype)
    if values is None or not len(values):
        return item.hex()
    value = values[0]
    return _format(complex(value) if np.iscomplexobj(values) else float(value))
