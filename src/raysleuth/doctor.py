"""``raysleuth doctor``: is this machine and cluster fit to debug on?

Each check returns a :class:`Check` (name, ok/warn/fail/skip, detail, fix,
node). Local checks need nothing; cluster checks connect (never start a
cluster) and fan out to the node agents, so per-node facts (versions,
py-spy, disk) are read on each node. A cluster that cannot be reached is a
failed check, not a crash.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from raysleuth import agents, runtime
from raysleuth.cluster import tcp_problem
from raysleuth.errors import ClusterUnreachable, RaySleuthError

__all__ = ["Check", "DoctorReport", "MIN_DEBUGPY", "MIN_RAY", "run_doctor"]

MIN_RAY = "2.10"
MIN_DEBUGPY = "1.8"
MIN_FREE_DISK = 5 * 1024**3
MIN_FREE_DISK_FAIL = 1 * 1024**3


@dataclasses.dataclass(kw_only=True)
class Check:
    """One finding of the doctor."""

    name: str
    status: str
    """``ok``, ``warn``, ``fail`` or ``skip``."""
    detail: str
    fix: str | None = None
    node: str | None = None
    """The node (ip) a per-node check is about."""
    category: str = "local"


@dataclasses.dataclass(kw_only=True)
class DoctorReport:
    """All checks, the cluster examined (if any), and how long it took."""

    checks: list[Check]
    cluster: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No check failed (warnings allowed)."""
        return not any(check.status == "fail" for check in self.checks)

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        counts = {"ok": 0, "warn": 0, "fail": 0, "skip": 0}
        for check in self.checks:
            counts[check.status] = counts.get(check.status, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``ok`` and ``counts`` included)."""
        return {"ok": self.ok, "counts": self.counts(), "seconds": self.seconds, "cluster": self.cluster,
                "checks": [dataclasses.asdict(check) for check in self.checks]}


def _version_tuple(text: str | None):
    from packaging.version import InvalidVersion, Version

    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _at_least(found: str | None, minimum: str) -> bool:
    found_version = _version_tuple(found)
    return found_version is not None and found_version >= _version_tuple(minimum)


# ----------------------------------------------------------- local checks


def _local_checks(env: Mapping[str, str]) -> list[Check]:
    checks: list[Check] = []
    found = agents.versions()
    python = platform.python_version()
    checks.append(Check(name="python", status="ok" if sys.version_info >= (3, 10) else "fail",
                        detail=f"Python {python} at {sys.executable}",
                        fix=None if sys.version_info >= (3, 10) else "use Python 3.10 or newer"))
    ray_version = found["ray"]
    if ray_version is None:
        checks.append(Check(name="ray", status="fail", detail="Ray is not installed",
                            fix='pip install "ray[default]>=2.10"'))
    else:
        good = _at_least(ray_version, MIN_RAY)
        checks.append(Check(name="ray", status="ok" if good else "fail", detail=f"Ray {ray_version}",
                            fix=None if good else f'pip install -U "ray[default]>={MIN_RAY}"'))
    debugpy = found["debugpy"]
    if debugpy is None:
        checks.append(Check(name="debugpy", status="warn", detail="debugpy is not installed: breakpoints fall back to pdb",
                            fix=f'pip install "debugpy>={MIN_DEBUGPY}"'))
    else:
        good = _at_least(debugpy, MIN_DEBUGPY)
        checks.append(Check(name="debugpy", status="ok" if good else "warn", detail=f"debugpy {debugpy}",
                            fix=None if good else f'pip install -U "debugpy>={MIN_DEBUGPY}"'))
    spy = agents.py_spy_check()
    if not spy["available"]:
        checks.append(Check(name="py-spy", status="fail", detail="py-spy is not installed: no stacks of hung workers",
                            fix='pip install py-spy (and add it to the job\'s runtime_env: {"pip": ["py-spy"]})'))
    elif not spy["can_dump"]:
        scope = spy["ptrace_scope"]
        checks.append(Check(name="py-spy", status="fail",
                            detail=f"py-spy at {spy['path']} cannot read other processes ({spy['detail']}); ptrace_scope={scope}",
                            fix="run as the job's user or root; in containers add --cap-add SYS_PTRACE; "
                                "or `sysctl kernel.yama.ptrace_scope=0`"))
    else:
        checks.append(Check(name="py-spy", status="ok", detail=f"py-spy {found['py-spy'] or ''} can dump processes ({spy['path']})".replace("  ", " ")))
    psutil_version = found["psutil"]
    checks.append(Check(name="psutil", status="ok" if psutil_version else "fail",
                        detail=f"psutil {psutil_version}" if psutil_version else "psutil is not installed",
                        fix=None if psutil_version else "pip install psutil"))
    checks.append(_torch_check())
    return checks


def _torch_check() -> Check:
    try:
        import torch
    except Exception:
        return Check(name="torch", status="skip", detail="torch is not installed (optional: tensor checks use numpy)")
    detail = f"torch {torch.__version__}"
    try:
        if torch.cuda.is_available():
            detail += f", CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}"
        else:
            detail += ", no CUDA device (CPU only)"
    except Exception as error:
        return Check(name="torch", status="warn", detail=f"{detail}; CUDA query failed: {error}",
                     fix="check the NVIDIA driver (nvidia-smi)")
    return Check(name="torch", status="ok", detail=detail)


def _debug_checks(env: Mapping[str, str]) -> list[Check]:
    settings = runtime.Settings.from_env(env)
    checks: list[Check] = []
    won = ", ".join(f"{name} from {source}" for name, source in settings.sources.items()) or "none set"
    status = "ok" if settings.debug else "warn"
    checks.append(Check(name="debug mode", category="debug", status=status,
                        detail=("Ray debug mode enabled" if settings.debug else "breakpoints are disarmed")
                        + f" (mode={settings.mode}; variables: {won})",
                        fix=None if settings.debug else "export RAYSLEUTH_DEBUG=1 (or `raysleuth debug arm` at runtime)"))
    for name, aliases in runtime.ENV_ALIASES.items():
        present = [var for var in (name, *aliases) if env.get(var, "") != ""]
        if len(present) > 1 and len({env[var] for var in present}) > 1:
            checks.append(Check(name=f"{name} aliases", category="debug", status="warn",
                                detail=f"{', '.join(f'{v}={env[v]}' for v in present)} disagree; {present[0]} wins",
                                fix=f"set only {name}"))
    for warning in settings.warnings:
        checks.append(Check(name="settings", category="debug", status="warn", detail=warning))
    hook = env.get("PYTHONBREAKPOINT")
    if hook and hook not in ("", "pdb.set_trace", "raysleuth.breakpoint"):
        checks.append(Check(name="PYTHONBREAKPOINT", category="debug", status="warn",
                            detail=f"PYTHONBREAKPOINT={hook}: breakpoint() calls go there, not to raysleuth",
                            fix="unset PYTHONBREAKPOINT or use rs.breakpoint() explicitly"))
    elif hook == "0":
        checks.append(Check(name="PYTHONBREAKPOINT", category="debug", status="warn",
                            detail="PYTHONBREAKPOINT=0 disables every breakpoint()", fix="unset PYTHONBREAKPOINT"))
    else:
        checks.append(Check(name="PYTHONBREAKPOINT", category="debug", status="ok",
                            detail=f"PYTHONBREAKPOINT={hook or '(unset)'}"))
    host = settings.debug_host
    if host in ("0.0.0.0", "::"):
        checks.append(Check(name="debug server host", category="debug", status="warn",
                            detail=f"debug servers will listen on {host}: anyone on the network can run code in your workers",
                            fix="unset RAYSLEUTH_DEBUG_HOST (default 127.0.0.1) and use an SSH tunnel"))
    try:
        with socket.socket() as probe:
            probe.bind((host if host not in ("0.0.0.0", "::") else "127.0.0.1", 0))
            port = probe.getsockname()[1]
        checks.append(Check(name="debug port", category="debug", status="ok",
                            detail=f"a debug server can listen on {host} (tried port {port})"))
    except OSError as error:
        checks.append(Check(name="debug port", category="debug", status="fail",
                            detail=f"cannot listen on {host}: {error}",
                            fix="set RAYSLEUTH_DEBUG_HOST to an address of this machine"))
    return checks


# --------------------------------------------------------- cluster checks


def _cluster_checks(address: str | None, *, ports: bool, per_node: bool, timeout: float,
                    info_out: dict[str, Any]) -> list[Check]:
    from raysleuth import cluster

    checks: list[Check] = []
    try:
        info = cluster.connect(address)
    except RaySleuthError as error:
        checks.append(Check(name="cluster reachable", category="cluster", status="fail",
                            detail=error.message, fix=error.fix))
        return checks
    info_out.update(dataclasses.asdict(info))
    checks.append(Check(name="cluster reachable", category="cluster", status="ok",
                        detail=f"Ray {info.ray_version} at {info.address}, session {info.session_name} "
                               f"(connected in {info.connect_seconds:.2f}s)"))
    all_nodes = cluster.nodes()
    alive = [node for node in all_nodes if node.alive]
    dead = [node for node in all_nodes if not node.alive]
    checks.append(Check(name="nodes alive", category="cluster", status="ok" if not dead else "warn",
                        detail=f"{len(alive)} alive" + (f", {len(dead)} dead: {', '.join(n.node_ip for n in dead)}" if dead else ""),
                        fix=None if not dead else "dead nodes take their workers with them: see `raysleuth tasks --dead`"))
    if info.auth_mode == "token":
        checks.append(Check(name="token authentication", category="security", status="ok",
                            detail=f"on (token from {info.auth_token_source})"))
    else:
        checks.append(Check(name="token authentication", category="security", status="warn",
                            detail="off: anyone who reaches the GCS or dashboard port can run code on the cluster",
                            fix="start the cluster with RAY_AUTH_MODE=token (see docs.ray.io ray-security/token-auth)"))
    if ports:
        checks.extend(_port_checks(info))
    if per_node:
        checks.extend(_node_checks(alive, timeout=timeout))
    return checks


def _port_checks(info) -> list[Check]:
    checks = []
    problem = tcp_problem(info.address)
    checks.append(Check(name="GCS port", category="ports", status="fail" if problem else "ok",
                        detail=f"{info.address} " + (f"unreachable: {problem}" if problem else "reachable"),
                        fix="open the GCS port between nodes and this machine" if problem else None))
    if info.dashboard_url:
        url = info.dashboard_url.split("://")[-1]
        dash_host, _, dash_port = url.rpartition(":")
        try:
            dash_port_number = int(dash_port.strip("/"))
        except ValueError:
            dash_port_number = 8265
        problem = tcp_problem(f"{dash_host or '127.0.0.1'}:{dash_port_number}")
        checks.append(Check(name="dashboard port", category="ports", status="fail" if problem else "ok",
                            detail=f"{url} " + (f"unreachable: {problem}" if problem else "reachable (State API works)"),
                            fix="the State API (tasks, timeline) needs the dashboard: start Ray with ray[default]" if problem else None))
        hosts = _listening_hosts(dash_port_number)
        if any(h in ("0.0.0.0", "::") for h in hosts):
            checks.append(Check(name="dashboard bind", category="security", status="warn",
                                detail=f"the dashboard listens on {', '.join(sorted(hosts))}:{dash_port_number}: "
                                       "anyone on the network can submit jobs",
                                fix="start Ray with --dashboard-host 127.0.0.1 and use an SSH tunnel"))
        elif hosts:
            checks.append(Check(name="dashboard bind", category="security", status="ok",
                                detail=f"dashboard listens on {', '.join(sorted(hosts))} only"))
    else:
        checks.append(Check(name="dashboard port", category="ports", status="warn",
                            detail="no dashboard: `tasks`, `trace` and `timeline` need Ray's State API",
                            fix='install "ray[default]" and start Ray with the dashboard'))
    return checks


def _listening_hosts(port: int) -> set[str]:
    try:
        import psutil

        return {conn.laddr.ip for conn in psutil.net_connections(kind="tcp")
                if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port}
    except Exception:
        return set()


def _node_label(result: agents.AgentResult) -> str:
    return f"{result.node_ip}/{result.node_id[:8]}"


def _node_checks(alive: list[Any], *, timeout: float) -> list[Check]:
    checks: list[Check] = []
    temp_dirs = {node.node_id: (node.temp_dir or "/tmp/ray",) for node in alive}
    try:
        version_results = agents.call_agents("versions", timeout=timeout)
        spy_results = agents.call_agents("py_spy_check", timeout=timeout)
        disk_results = agents.call_agents("disk_free", timeout=timeout, per_node_args=temp_dirs)
    except RaySleuthError as error:
        return [Check(name="node agents", category="nodes", status="fail", detail=error.message, fix=error.fix)]
    keys = ("python", "ray", "torch", "raysleuth")
    seen: dict[str, dict[str, set[str]]] = {key: {} for key in keys}
    for result in version_results:
        if not result.ok:
            checks.append(Check(name="node agent", category="nodes", status="fail", node=_node_label(result),
                                detail=result.error, fix="the node may be overloaded or dying: `ray status`"))
            continue
        found = result.value
        for key in keys:
            seen[key].setdefault(str(found.get(key)), set()).add(_node_label(result))
        checks.append(Check(name="versions", category="nodes", status="ok", node=_node_label(result),
                            detail=", ".join(f"{key} {found.get(key)}" for key in keys)))
    for key, by_value in seen.items():
        if len(by_value) > 1:
            spread = "; ".join(f"{value} on {', '.join(sorted(ips))}" for value, ips in sorted(by_value.items()))
            checks.append(Check(name=f"{key} version match", category="nodes", status="fail",
                                detail=f"{key} differs between nodes: {spread}",
                                fix=f"install the same {key} on every node (a classic 'works on one node' cause)"))
        elif by_value:
            checks.append(Check(name=f"{key} version match", category="nodes", status="ok",
                                detail=f"{key} {next(iter(by_value))} on all {len(next(iter(by_value.values())))} node(s)"))
    for result in spy_results:
        if not result.ok:
            checks.append(Check(name="py-spy on node", category="nodes", status="fail", node=_node_label(result),
                                detail=result.error))
            continue
        spy = result.value
        good = spy["available"] and spy["can_dump"]
        checks.append(Check(name="py-spy on node", category="nodes", status="ok" if good else "fail", node=_node_label(result),
                            detail=spy["detail"] + (f" ({spy['path']})" if spy["path"] else ""),
                            fix=None if good else (f'py-spy not usable on node {_node_label(result)}: add it to the job\'s runtime_env, '
                                                   'e.g. {"pip": ["py-spy"]}, and allow ptrace (SYS_PTRACE)')))
    for result in disk_results:
        if not result.ok or "error" in (result.value or {}):
            checks.append(Check(name="spill disk", category="nodes", status="warn", node=_node_label(result),
                                detail=result.error or result.value.get("error")))
            continue
        free = result.value["free"]
        status = "fail" if free < MIN_FREE_DISK_FAIL else "warn" if free < MIN_FREE_DISK else "ok"
        checks.append(Check(name="spill disk", category="nodes", status=status, node=_node_label(result),
                            detail=f"{free / 1024**3:.1f} GiB free at {result.value['path']} (object spilling, logs)",
                            fix=None if status == "ok" else "free disk space or point Ray's --temp-dir at a larger disk"))
    return checks


def _debug_cluster_checks(*, timeout: float) -> list[Check]:
    """Per node: can breakpoints start debugpy there; are debug servers listening on every interface?"""
    checks: list[Check] = []
    try:
        results = agents.call_agents("versions", timeout=timeout)
    except RaySleuthError as error:
        return [Check(name="debugpy on node", category="debug", status="fail", detail=error.message, fix=error.fix)]
    for result in results:
        if not result.ok:
            continue  # the node checks report unreachable agents
        found = (result.value or {}).get("debugpy")
        good = _at_least(found, MIN_DEBUGPY)
        checks.append(Check(name="debugpy on node", category="debug", status="ok" if good else "warn",
                            node=_node_label(result),
                            detail=f"debugpy {found}" if found else "debugpy is not installed: breakpoints there fall back to pdb",
                            fix=None if good else f'add it to the job\'s runtime_env, e.g. {{"pip": ["debugpy>={MIN_DEBUGPY}"]}}'))
    try:
        from raysleuth import breakpoints

        sessions = breakpoints.list_sessions(live=True)
    except Exception as error:
        checks.append(Check(name="debug sessions", category="debug", status="skip", detail=f"not readable: {error}"))
        return checks
    exposed = [session for session in sessions if session.host in ("0.0.0.0", "::")]
    for session in exposed:
        checks.append(Check(name="debug server bind", category="security", status="warn", node=session.node_ip,
                            detail=f"session {session.id} (rank {session.rank}, pid {session.pid}) listens on "
                                   f"{session.host}:{session.port}: anyone on the network can run code in that worker",
                            fix="unset RAYSLEUTH_DEBUG_HOST (default 127.0.0.1) and use an SSH tunnel"))
    if not exposed:
        waiting = sum(1 for session in sessions if session.state == "waiting")
        checks.append(Check(name="debug sessions", category="debug", status="ok",
                            detail=f"{len(sessions)} live ({waiting} waiting), none listening on 0.0.0.0"))
    return checks


def run_doctor(
    address: str | None = None,
    *,
    check_debug: bool = False,
    check_ports: bool = False,
    ray: bool = True,
    full: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    record: bool = True,
) -> DoctorReport:
    """Run the checks. ``full`` turns on every group; ``ray=False`` skips the cluster.

    With a reachable cluster, the report is also stored as evidence (kind
    ``doctor``) so ``raysleuth report`` shows it later.
    """
    started = time.monotonic()
    env = os.environ if env is None else env
    checks = _local_checks(env)
    if check_debug or full:
        checks += _debug_checks(env)
    cluster_info: dict[str, Any] = {}
    if ray or full:
        checks += _cluster_checks(address, ports=check_ports or full, per_node=True, timeout=timeout,
                                  info_out=cluster_info)
        if (check_debug or full) and cluster_info:
            checks += _debug_cluster_checks(timeout=timeout)
    report = DoctorReport(checks=checks, cluster=cluster_info or None, seconds=time.monotonic() - started)
    if record and cluster_info:
        from raysleuth.recorder import get_client

        try:
            client = get_client()
            client.record("doctor", report.to_dict(), name="doctor")
            client.flush(timeout=5)
        except Exception:
            pass
    return report
