"""The report's charts: plotly figures written as the plain dicts plotly.js reads, and each one's HTML.

Built as ``plotly.graph_objects`` figures, the three charts were a third of
the report's rendering (0.36 -> 0.23 CPU s at 1,000 ranks): every trace and
property validated, and the ``plotly_white`` template deep-copied per
figure. These dicts take the template once from plotly's own package data;
``tests/test_scale.py`` holds that plotly's validation of each changes
nothing (the page draws what it drew).
"""

from __future__ import annotations

import functools
import json
import statistics
from typing import Any

from raysleuth.report import sections

__all__ = ["HEIGHT", "MARGIN", "charts", "figure_html", "figures", "memory_figure", "phases_figure", "steps_figure",
           "template"]

#: What every chart's layout adds (plotly's ``plotly_white`` template, margins, height).
MARGIN = {"l": 50, "r": 20, "t": 40, "b": 40}
HEIGHT = 360


@functools.cache
def template() -> dict[str, Any]:
    """plotly's ``plotly_white`` template as plotly.py writes it into a figure (its package data, unvalidated)."""
    from importlib import resources

    return json.loads(resources.files("plotly").joinpath("package_data/templates/plotly_white.json").read_text())


def figure_html(figure: dict[str, Any], div_id: str) -> str:
    """One figure's ``<div>`` and script (plotly.js is embedded once, by the page)."""
    import plotly.io as pio

    figure["layout"].update(template=template(), margin=dict(MARGIN), height=HEIGHT)
    return pio.to_html(figure, full_html=False, include_plotlyjs=False, div_id=div_id, validate=False,
                       config={"displaylogo": False, "responsive": True})


def _layout(title: str, **axes: str) -> dict[str, Any]:
    """A layout with ``title`` and axis titles (``xaxis="seconds"``), as plotly writes ``xaxis_title=...``."""
    layout: dict[str, Any] = {"title": {"text": title}}
    for axis, text in axes.items():
        layout[axis] = {"title": {"text": text}}
    return layout


def _band_traces(band: dict[str, Any] | None, what: str) -> list[dict[str, Any]]:
    """The many ranks drawn as one group: their lowest and highest as a filled band, their median as a line."""
    if not band:
        return []
    name = f"{band['count']} {what}"
    return [{"type": "scatter", "x": band["x"], "y": band["high"], "mode": "lines", "line": {"width": 0},
             "showlegend": False, "name": f"{name}: highest", "hoverinfo": "x+y+name"},
            {"type": "scatter", "x": band["x"], "y": band["low"], "mode": "lines", "line": {"width": 0},
             "fill": "tonexty", "fillcolor": "rgba(99,110,250,0.2)", "name": f"{name}: lowest to highest",
             "hoverinfo": "x+y+name"},
            {"type": "scatter", "x": band["x"], "y": band["median"], "mode": "lines",
             "line": {"width": 2, "color": "rgb(99,110,250)"}, "name": f"{name}: median"}]


def memory_figure(memory: dict[str, Any]) -> dict[str, Any]:
    """RSS per rank: the band of the many, each leaking or standing-out worker's own line."""
    leaking = {sections.rank_label(v["rank"]) + (f" · pid {v['pid']}" if v.get("pid") else "")
               for v in memory["verdicts"] if v["leak"]}
    data = _band_traces(memory.get("band"), "workers")
    for label, curve in memory["curves"].items():
        data.append({"type": "scatter", "x": curve["x"], "y": curve["y"], "mode": "lines+markers",
                     "name": label + (" (leak)" if label in leaking else ""),
                     "line": {"width": 4 if label in leaking else 2}})
    return {"data": data, "layout": _layout("Memory (RSS) per rank", xaxis="seconds since first sample",
                                            yaxis="MiB")}


def steps_figure(spans: dict[str, Any]) -> dict[str, Any]:
    """Step time per rank, the stragglers marked (one trace for every mark: a trace each cost the page 2 KB)."""
    data = _band_traces(spans.get("band"), "ranks")
    for rank in spans.get("alone", spans["ranks"]):
        data.append({"type": "scatter", "x": spans["steps"], "y": spans["totals"][rank], "mode": "lines+markers",
                     "name": sections.rank_label(rank)})
    marked = spans["stragglers"][:500]
    if marked:
        data.append({
            "type": "scatter", "x": [straggler["step"] for straggler in marked],
            "y": [straggler["step_seconds"] for straggler in marked], "mode": "markers",
            "marker": {"size": 14, "symbol": "x", "color": "red"}, "name": "stragglers",
            "text": [f"straggler rank {straggler['rank']} ({straggler['phase']} {straggler['ratio']}× the median)"
                     for straggler in marked],
            "hovertemplate": "step %{x}: %{y} s<br>%{text}<extra></extra>"})
    return {"data": data, "layout": _layout("Step time per rank (top-level spans)", xaxis="step", yaxis="seconds")}


def phases_figure(spans: dict[str, Any]) -> dict[str, Any]:
    """Mean seconds per step by phase: every rank, or past 16 ranks the median rank and the stragglers."""
    ranks = spans["ranks"]
    columns = {sections.rank_label(rank): spans["mean_phase"][rank] for rank in ranks}
    if spans.get("band"):
        others = [rank for rank in ranks if rank not in spans["alone"]]
        columns = {f"median of {len(others)} ranks": {
            phase: statistics.median(spans["mean_phase"][rank][phase] for rank in others) for phase in spans["phases"]}}
        columns.update({sections.rank_label(rank): spans["mean_phase"][rank] for rank in spans["alone"]})
    data = [{"type": "bar", "x": list(columns), "y": [means[phase] for means in columns.values()], "name": phase}
            for phase in spans["phases"]]
    layout = _layout("Mean seconds per step, by phase and rank", yaxis="seconds")
    layout["barmode"] = "stack"
    return {"data": data, "layout": layout}


def figures(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The report's figures by chart name (a chart with nothing to draw is left out)."""
    drawn: dict[str, dict[str, Any]] = {}
    memory = data["memory"]
    if memory["curves"] or memory.get("band"):
        drawn["memory"] = memory_figure(memory)
    spans = data["spans"]
    if spans["steps"]:
        drawn["steps"] = steps_figure(spans)
        drawn["phases"] = phases_figure(spans)
    return drawn


def charts(data: dict[str, Any]) -> dict[str, str]:
    """Each chart's HTML by name, for the page's template."""
    return {name: figure_html(figure, f"chart-{name}") for name, figure in figures(data).items()}
