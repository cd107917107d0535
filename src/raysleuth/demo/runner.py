"""Run the demo job under faults and diagnose each one with raysleuth, as a user would.

:func:`run_demo` connects to Ray once (an already-connected Ray in this
process, else ``--address``, else a fresh embedded local Ray — never some
other cluster found by ``auto``), runs each scenario (:mod:`.scenarios`),
writes the HTML report and returns a :class:`DemoResult`. Progress goes to
an optional callback (the CLI prints it); nothing here prints.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import raysleuth as rs
from raysleuth import cluster, runtime
from raysleuth.demo import scenarios as catalogue
from raysleuth.demo.harness import ScenarioResult, flush_evidence
from raysleuth.demo.job import JobConfig
from raysleuth.errors import ToolMissing, UsageError
from raysleuth.recorder import get_writer

__all__ = ["DemoResult", "connect_for_demo", "run_demo"]

Progress = Callable[[str], None]


@dataclasses.dataclass(kw_only=True)
class DemoResult:
    """Every scenario's result, and where the evidence and the report are."""

    results: list[ScenarioResult]
    run_id: str | None = None
    home: str | None = None
    report_path: str | None = None
    trace_path: str | None = None
    address: str | None = None
    started_here: bool = False
    seconds: float = 0.0
    report_error: str | None = None

    @property
    def ok(self) -> bool:
        """Every scenario diagnosed correctly."""
        return bool(self.results) and all(result.correct for result in self.results)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``ok`` included)."""
        data = dataclasses.asdict(self)
        data["ok"] = self.ok
        return data


def connect_for_demo(address: str | None = None, *, num_cpus: int = 8):
    """The demo's Ray: the one this process is connected to, else ``address``, else a fresh local one.

    Returns ``(ClusterInfo, started_here)``. Without ``address`` the demo
    never attaches to a cluster found by ``auto`` (other jobs may run there).
    """
    import ray

    if ray.is_initialized():
        return cluster.connect(), False
    if address:
        return cluster.connect(address), False
    # Never `auto`: another job's cluster on this machine is not the demo's to use.
    info = cluster.start_local(num_cpus=num_cpus, log_to_driver=False)
    return info, True


def run_demo(
    scenarios: Iterable[str] | None = None,
    *,
    address: str | None = None,
    report_path: Path | str | None = None,
    config: JobConfig | None = None,
    progress: Progress | None = None,
    write_report: bool = True,
) -> DemoResult:
    """Run the scenarios (default: all), diagnose each, write the report; see :class:`DemoResult`."""
    names = list(scenarios or catalogue.SCENARIOS)
    unknown = [name for name in names if name not in catalogue.SCENARIOS]
    if unknown:
        raise UsageError(f"unknown scenario(s) {', '.join(unknown)}",
                         fix=f"pick from {', '.join(catalogue.SCENARIOS)}")
    try:
        import torch  # noqa: F401  (the job is a torch job)
    except ImportError:
        raise ToolMissing("the demo trains a torch policy and torch is not installed",
                          fix="pip install 'raysleuth[torch]' (CPU torch is enough)") from None
    say = progress or (lambda message: None)
    config = config or JobConfig()
    started = time.monotonic()
    say("connecting to Ray" if address else "starting Ray (or reusing this process's connection)")
    info, started_here = connect_for_demo(address)

    writer = get_writer()
    import ray

    writer_info = ray.get(writer.info.remote(), timeout=60)
    say(f"Ray {info.ray_version} at {info.address}; run {info.session_name}; evidence in {writer_info['path']}")
    result = DemoResult(results=[], run_id=info.session_name, home=str(runtime.settings().home),
                        address=info.address, started_here=started_here)
    for name in names:
        say(f"scenario {name}: {catalogue.INJECTED[name]}")
        scenario_started = time.monotonic()
        try:
            outcome = catalogue.RUNNERS[name](config, say)
        except Exception as error:  # a scenario that cannot run is reported, not raised
            outcome = ScenarioResult(scenario=name, injected=catalogue.INJECTED[name], found_by="-",
                                     verdict=f"scenario failed to run: {type(error).__name__}: {error}",
                                     expected=catalogue.EXPECTED[name], correct=False,
                                     error=f"{type(error).__name__}: {error}")
        outcome.seconds = round(time.monotonic() - scenario_started, 2)
        result.results.append(outcome)
        say(f"scenario {name}: {'correct' if outcome.correct else 'WRONG'} — {outcome.verdict}")
    flush_evidence()
    if write_report:
        say("writing the report")
        _write_report(result, writer_info, report_path)
    result.seconds = round(time.monotonic() - started, 2)
    return result


def _write_report(result: DemoResult, writer_info: dict[str, Any], report_path: Path | str | None) -> None:
    import ray

    store_path = Path(writer_info["path"])
    output = Path(report_path) if report_path else store_path.parent / "report.html"
    # Give the writer a moment to commit what the workers flushed last.
    try:
        ray.get(ray.get_actor("raysleuth-writer", namespace="raysleuth").info.remote(), timeout=10)
    except Exception:
        pass
    trace = output.parent / "trace.json"
    try:
        rs.export_timeline(trace, run=str(store_path))
        result.trace_path = str(trace)
    except Exception as error:
        result.report_error = f"timeline export failed: {type(error).__name__}: {error}"
    try:
        report = rs.generate_report(output, run=str(store_path), trace_path=trace if trace.is_file() else None)
        result.report_path = str(report.path)
    except Exception as error:
        result.report_error = f"report failed: {type(error).__name__}: {error}"
