"""The doctor's checks of this machine: versions, tools, disk, and (``--check-debug``) the debug settings."""

from __future__ import annotations

import platform
import socket
import sys
from collections.abc import Mapping

from raysleuth import agents, runtime
from raysleuth.doctor.checks import MIN_DEBUGPY, MIN_RAY, Check, CheckStatus, _at_least


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
    status: CheckStatus = "ok" if settings.debug else "warn"
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
