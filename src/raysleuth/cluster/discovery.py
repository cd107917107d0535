"""Which Ray cluster a command talks to: one deterministic choice, and the others named.

Order: ``--address``, then ``RAY_ADDRESS``, then the cluster Ray itself
calls current (``/tmp/ray/ray_current_cluster``, written by the last
``ray start``) when it is alive, then the only cluster running on this
machine, then, with several and none current, the newest started. Ray's own
fallback for ``auto`` takes any of them (a set's order), so two calls in a
row could talk to two clusters; here the choice and every other live
cluster (with the ``--address`` that picks it) are in :class:`AddressChoice`.

Live clusters are found from this machine's raylet processes (their command
line carries the GCS address, the session name and the temp dir), read with
psutil; nothing is asked of Ray.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from raysleuth import ray_private

__all__ = ["AddressChoice", "LocalCluster", "choose_address", "local_clusters"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalCluster:
    """One Ray cluster with a raylet on this machine."""

    address: str
    """Its GCS address (ip:port)."""
    session_name: str | None
    temp_dir: str | None
    started: float
    """When its oldest raylet on this machine started (Unix time)."""


@dataclasses.dataclass(kw_only=True)
class AddressChoice:
    """The address chosen, why, and the other clusters alive on this machine."""

    address: str | None
    """ip:port, or ``None`` when no cluster was found."""
    reason: str
    """``--address``, ``RAY_ADDRESS``, ``ray_current_cluster``, ``the only cluster``, ``the newest of N``, ``none``."""
    chosen: LocalCluster | None = None
    others: list[LocalCluster] = dataclasses.field(default_factory=list)
    """Other live clusters on this machine (never the chosen one)."""

    def notice(self) -> str | None:
        """The line to show when several clusters are alive (``None`` when only one is)."""
        if not self.others:
            return None
        listed = "; ".join(f"--address {other.address}" + (f" ({other.session_name})" if other.session_name else "")
                           for other in self.others)
        return (f"{len(self.others) + 1} Ray clusters on this machine; using {self.address} ({self.reason}); "
                f"others: {listed}")


def _flag(words: list[str], name: str) -> str | None:
    for word in words:
        if word.startswith(name + "="):
            value = word.split("=", 1)[1]
            if value and value != "None":
                return value
    return None


def local_clusters() -> list[LocalCluster]:
    """Every Ray cluster with a raylet on this machine, oldest first (one entry per GCS address)."""
    import psutil

    found: dict[str, LocalCluster] = {}
    for process in psutil.process_iter(["cmdline", "create_time"]):
        try:
            cmdline = process.info["cmdline"] or []
        except (psutil.Error, KeyError):
            continue
        if not cmdline or "raylet" not in os.path.basename(cmdline[0]):
            continue
        words = [word for argument in cmdline for word in argument.split(" ")]
        address = _flag(words, "--gcs-address") or _flag(words, "--gcs_address")
        if not address:
            continue
        started = process.info.get("create_time") or 0.0
        known = found.get(address)
        if known is None or started < known.started:
            found[address] = LocalCluster(
                address=address,
                session_name=_flag(words, "--session-name") or _flag(words, "--session_name"),
                temp_dir=_flag(words, "--temp-dir") or _flag(words, "--temp_dir"),
                started=started)
    return sorted(found.values(), key=lambda item: (item.started, item.address))


def _same(address: str, other: str) -> bool:
    host, _, port = address.rpartition(":")
    other_host, _, other_port = other.rpartition(":")
    local = {"127.0.0.1", "localhost", ""}
    return port == other_port and (host == other_host or host in local or other_host in local)


def choose_address(address: str | None, *, env: dict[str, str] | None = None,
                   current: str | None = None, clusters: list[LocalCluster] | None = None) -> AddressChoice:
    """Resolve ``address`` (``None``/``auto`` included) deterministically; see the module's docstring.

    ``env``, ``current`` (the address in ``ray_current_cluster``) and
    ``clusters`` default to this machine's; tests pass them in.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    explicit = address if address not in (None, "", "auto", "local") else None
    reason = "--address"
    if explicit is None and environ.get("RAY_ADDRESS") not in (None, "", "auto", "local"):
        explicit, reason = environ["RAY_ADDRESS"], "RAY_ADDRESS"
    alive = local_clusters() if clusters is None else clusters
    if explicit is not None:
        chosen = next((item for item in alive if _same(item.address, explicit)), None)
        others = [item for item in alive if item is not chosen] if chosen is not None else list(alive)
        return AddressChoice(address=explicit, reason=reason, chosen=chosen, others=others)
    if current is None and clusters is None:
        current = _current_cluster_address()
    chosen = next((item for item in alive if current and _same(item.address, current)), None)
    if chosen is not None:
        reason = "Ray's current cluster, /tmp/ray/ray_current_cluster"
    elif len(alive) == 1:
        chosen, reason = alive[0], "the only cluster on this machine"
    elif alive:
        chosen, reason = alive[-1], f"the newest started of {len(alive)}"
    if chosen is None and current and not alive:  # raylets unreadable here: trust Ray's file
        return AddressChoice(address=current, reason="Ray's current cluster, /tmp/ray/ray_current_cluster")
    if chosen is None:
        return AddressChoice(address=None, reason="none")
    return AddressChoice(address=chosen.address, reason=reason, chosen=chosen,
                         others=[item for item in alive if item is not chosen])


def _current_cluster_address() -> str | None:
    """The address in Ray's ``ray_current_cluster`` file (written by ``ray start``), or ``None``."""

    try:
        found = ray_private.services().find_bootstrap_address(None)
    except Exception:
        return None
    return found or None
