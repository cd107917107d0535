"""The doctor's checks of the connected cluster: reachable, nodes, token auth, ports, per-node facts, debug servers.

They connect (never start a cluster) and fan out to the node agents, so
per-node facts (versions, py-spy, disk) are read on each node.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raysleuth import agents, breakpoints, cluster
from raysleuth.cluster import tcp_problem
from raysleuth.doctor.checks import MIN_DEBUGPY, MIN_FREE_DISK, MIN_FREE_DISK_FAIL, Check, CheckStatus, _at_least
from raysleuth.errors import RaySleuthError


def _cluster_checks(address: str | None, *, ports: bool, per_node: bool, timeout: float,
                    info_out: dict[str, Any]) -> list[Check]:
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
                        detail=f"{len(alive)} alive" + (f", {len(dead)} dead: {', '.join(n.node_ip or n.node_id or '?' for n in dead)}" if dead else ""),
                        fix=None if not dead else "dead nodes take their workers with them: see `raysleuth tasks --dead`"))
    if info.auth_mode == "token" and info.token_mode_switched_here:
        checks.append(Check(name="token authentication", category="security", status="warn",
                            detail=f"on (token from {info.auth_token_source}), but RAY_AUTH_MODE is not set here: a "
                                   "job started from this environment (a second driver, RAY_ADDRESS) fails with "
                                   "InvalidAuthToken",
                            fix="export RAY_AUTH_MODE=token before starting the job, or start it with "
                                "`raysleuth run --address ...` (which passes it)"))
    elif info.auth_mode == "token":
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
                                detail=result.error or "", fix="the node may be overloaded or dying: `ray status`"))
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
                                detail=result.error or ""))
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
        status: CheckStatus = "fail" if free < MIN_FREE_DISK_FAIL else "warn" if free < MIN_FREE_DISK else "ok"
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
