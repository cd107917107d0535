"""``raysleuth memory``: each worker's memory now, its peak, trend and leak verdict."""

from __future__ import annotations

import contextlib
from typing import Annotated

from rich.markup import escape
from rich.table import Table

from raysleuth.cli._app import (
    AddressOption,
    HomeOption,
    JobOption,
    JsonOption,
    RanksOption,
    RunOption,
    SinceOption,
    app,
    connect,
    console,
    duration_option,
    emit_json,
    finish,
    home_path,
    name_run,
)
from raysleuth.cli._app import writer_timeout
from raysleuth.errors import CaptureTimeout, UsageError
from raysleuth.options import format_ranks

@contextlib.contextmanager
def _progress(duration: float, *, show: bool):
    """A progress bar over ``duration`` seconds on a terminal (nothing in a pipe or with --json)."""
    if not show:
        yield
        return
    import threading
    import time

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    done = threading.Event()
    with Progress(TextColumn("sampling workers"), BarColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("sample", total=duration)
        started = time.monotonic()

        def tick() -> None:
            while not done.wait(0.25):
                progress.update(task, completed=min(duration, time.monotonic() - started))

        ticker = threading.Thread(target=tick, daemon=True, name="raysleuth-progress")
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join(timeout=1)


def _mib(value) -> str:
    return "" if value is None else f"{value / 2**20:,.1f}"


@app.command()
def memory(
    address: AddressOption = None,
    rank: RanksOption = None,
    run: RunOption = None,
    home: HomeOption = None,
    sample: Annotated[float | None, duration_option(
        "--sample", help="Sample every Ray worker through the node agents for this long (e.g. 30s), then report.")] = None,
    interval: Annotated[float, duration_option("--interval", help="Time between agent samples with --sample.")] = 1.0,
    since: SinceOption = None,
    job: JobOption = None,
    json_: JsonOption = False,
) -> None:
    """Per worker: memory now, peak, trend and leak verdict (exit 1 when a worker leaks)."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.memory import memory_report, sample_workers
    from raysleuth.recorder import open_store
    from raysleuth.recorder.reading import one_shot

    one_shot()  # this process answers once and exits: what the read keeps alive is frozen, not walked again

    problems: list[str] = []
    if sample is not None and since is not None:
        raise UsageError("--sample and --since both set the window", fix="--sample 30s judges what it sampled")
    if sample is not None:
        import time as _time
        from pathlib import Path

        duration, step = sample, interval
        if step <= 0 or duration <= 0:
            raise UsageError(f"--sample {sample:g}s --interval {interval:g}s: both must be positive",
                             fix="e.g. --sample 30s --interval 1s")
        connect(address)
        since = _time.time()
        with _progress(duration, show=console.is_terminal and not json_):
            done = sample_workers(duration, step, writer_timeout=writer_timeout())
        problems = done.problems
        if run is None:
            import ray

            # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
            from raysleuth.recorder import get_writer

            try:
                info = ray.get(get_writer().info.remote(), timeout=writer_timeout())
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as error:
                raise CaptureTimeout(f"the evidence writer did not answer within {writer_timeout():g}s "
                                     f"({type(error).__name__}); the samples may not be stored",
                                     fix="check `raysleuth doctor`, then `raysleuth memory` reads what arrived"
                                     ) from None
            run = info["path"] if Path(info["path"]).is_file() else info["run_id"]
        if not json_:
            console.print(f"sampled {done.workers} worker(s) {done.rounds} time(s) in {done.seconds:.1f}s "
                          f"({done.samples} samples)")
    store = open_store(name_run(run, home), home=home_path(home))
    try:
        # the table shows no MiB/step, and past TABLE_ROWS workers the lines of the leaks and GROWERS only
        report = memory_report(store, rank=rank, since=since, job=job, per_step=json_,
                               fit_quiet=None if json_ else GROWERS, fit_past=TABLE_ROWS)
    finally:
        store.close()
    if json_:
        verdict = "leak" if report.leaks else "not enough data" if report.undecided else "ok"
        emit_json({"workers": report.to_dict()["workers"], "store": report.store, "problems": problems,
                   "verdict": verdict})
        finish(1 if report.leaks or report.undecided else 0)  # "could not tell" is never exit 0
    if not report.workers:
        console.print("no memory samples in this run: call rs.memory.watch() in the workers, "
                      "or sample them from outside with `raysleuth memory --sample 30s`")
        finish(0)
    _print_report(report, problems)
    finish(1 if report.leaks or report.undecided else 0)  # "could not tell" is never exit 0


#: Ray's own processes the node agents sample too (no rank: named, so no row is unlabelled).
_RAYS_OWN = ("DashboardAgent", "RuntimeEnvAgent", "dashboard", "raylet", "gcs_server", "log_monitor")


def _who(worker) -> str:
    """The worker column: its actor class (and name), ``Ray's own`` for Ray's agents, else its role."""
    name = worker.actor_class or worker.actor_name or ""
    if any(name.startswith(own) for own in _RAYS_OWN):
        return escape(f"{name} (Ray's own)")
    if worker.actor_name and worker.actor_class and worker.actor_name != worker.actor_class:
        name = f"{worker.actor_class} {worker.actor_name}"
    return escape(name or ("task worker" if worker.source == "agent" else "worker"))


#: Past this many workers the table shows the ones that stand out and one line for the rest.
TABLE_ROWS = 40
#: ...among them, at most this many without a leak: those whose memory grew most (only those are fitted a line).
GROWERS = 5


def _shown(report) -> tuple[list, list]:
    """(workers drawn as rows, workers summed up in one line): every leak and undecided one first (up to
    :data:`TABLE_ROWS`), then the :data:`GROWERS` whose memory grew most (``memory_report``'s ``fit_quiet``
    order); the rest are summed up."""
    workers = report.workers
    if len(workers) <= TABLE_ROWS:
        return workers, []
    flagged = [w for w in workers if w.leak or w.status != "ok"][:TABLE_ROWS]
    growers = sorted((w for w in workers if not (w.leak or w.status != "ok")),
                     key=lambda w: -w.evidence["growth_bytes"])[:max(0, min(GROWERS, TABLE_ROWS - len(flagged)))]
    chosen = {id(w) for w in flagged + growers}
    return [w for w in workers if id(w) in chosen], [w for w in workers if id(w) not in chosen]


def _rest_line(rest: list) -> str:
    """One line for the workers not drawn: how many, which ranks, their verdicts and memory ranges."""
    ranks = [w.rank for w in rest if w.rank is not None]
    verdicts = sorted({"ok" if w.status == "ok" else w.status for w in rest})
    text = f"… {len(rest)} more worker(s)" + (f", ranks {format_ranks(ranks)}" if ranks else "")
    text += f": {'/'.join(verdicts)}"
    for label, values in (("rss", [w.rss_bytes for w in rest]), ("peak", [w.peak_bytes for w in rest])):
        known = [v for v in values if v is not None]
        if known:
            text += f"; {label} {_mib(min(known))}–{_mib(max(known))} MiB"
    return escape(text) + " (--rank N or --json shows each)"


def _print_report(report, problems: list[str]) -> None:
    """The per-worker table (many workers: those that stand out, and one line for the rest), the problems of
    the sampling, and the one-line verdict."""
    # lazy: a command loads its feature when it runs (the CLI starts in 0.25 s, not 0.9 s)
    from raysleuth.memory import sparkline

    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("rank", "worker", "pid", "node", "src", "n", "rss MiB", "uss MiB", "cuda MiB", "peak MiB",
                   "MiB/s", "trend", "verdict"):
        table.add_column(column, overflow="fold")
    shown, rest = _shown(report)
    for worker in shown:
        slope = worker.slope_bytes_per_s
        reason = escape(worker.reason or "")
        if worker.leak:
            verdict = f"[red]LEAK[/red] {reason}"
        elif worker.status == "ok":
            verdict = f"[green]ok[/green] [dim]{reason}[/dim]"
        else:
            verdict = f"[yellow]{reason}[/yellow]"  # "not enough data: ...", never "ok"
        table.add_row(
            "" if worker.rank is None else str(worker.rank), _who(worker), str(worker.pid), escape(worker.node_ip or ""),
            escape(worker.source or ""), str(worker.samples), _mib(worker.rss_bytes), _mib(worker.uss_bytes),
            _mib(worker.cuda_allocated_bytes), _mib(worker.peak_bytes),
            "" if slope is None else f"{slope / 2**20:+.2f}", sparkline(worker.series, 20), verdict,
        )
    console.print(table)
    if rest:
        console.print(f"[dim]{_rest_line(rest)}[/dim]", soft_wrap=True)
    for problem in problems:
        console.print(f"[yellow]⚠️  {escape(problem)}[/yellow]", soft_wrap=True)
    leaks = report.leaks
    if leaks:
        names = ", ".join(f"rank {w.rank}" if w.rank is not None else f"pid {w.pid}" for w in leaks)
        console.print(f"\n[red]leak found[/red]: {names}")
    elif report.undecided:
        console.print(f"\n[yellow]not enough data[/yellow] for {len(report.undecided)} of {len(report.workers)} "
                      f"worker(s): sample longer (e.g. --sample 30s) to judge them")
    else:
        console.print(f"\n[green]no leak[/green] in {len(report.workers)} worker(s)")
