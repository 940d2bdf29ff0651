"""Plotly figures of a race, rebuilt from the blocks shown so far (so they grow live).

Metrics come from the engine's `Summary` properties (over a provisional summary while running),
so the charts and the trace download always agree. Figures are built from plain dicts without
plotly's per-property validation, which is too slow to redraw four figures several times a
second on a busy CPU.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate

import plotly.graph_objects as go
import plotly.io as pio

from .race import SideView

DFLASH_COLOR = "#2f9e44"
PLAIN_COLOR = "#4c6ef5"


@lru_cache(maxsize=1)
def _template() -> dict:
    return pio.templates["plotly_white"].to_plotly_json()


def _figure(title: str, x_title: str, y_title: str, traces: list[dict], **axes) -> go.Figure:
    layout = {
        "title": {"text": title, "font": {"size": 14}},
        "height": 260,
        "margin": {"l": 50, "r": 10, "t": 40, "b": 40},
        "xaxis": {"title": {"text": x_title}, **axes.get("xaxis", {})},
        "yaxis": {"title": {"text": y_title}, **axes.get("yaxis", {})},
        "template": _template(),
        "legend": {"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"},
        "uirevision": "race",  # keep the user's zoom while frames stream in
    }
    if not traces:
        layout["annotations"] = [
            {"text": "waiting for blocks…", "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}
        ]
    return go.Figure({"data": traces, "layout": layout}, _validate=False)


def acceptance_figure(view: SideView) -> go.Figure:
    lengths = [b.acceptance_length for b in view.blocks]
    running = [total / (i + 1) for i, total in enumerate(accumulate(lengths))]  # linear: a long trace stays cheap
    x = list(range(len(lengths)))
    traces = (
        [
            {
                "type": "bar",
                "x": x,
                "y": lengths,
                "name": "acceptance length",
                "marker": {"color": DFLASH_COLOR},
                "opacity": 0.7,
            },
            {
                "type": "scatter",
                "x": x,
                "y": running,
                "mode": "lines",
                "line": {"color": "#222"},
                "name": f"tau (running mean) = {running[-1]:.2f}" if running else "tau",
            },
        ]
        if lengths
        else []
    )
    return _figure(
        "Acceptance length per block",
        "block",
        "tokens accepted (incl. bonus)",
        traces,
        yaxis={"range": [0, view.block_size + 0.5]},
    )


def speed_figure(dflash: SideView, plain: SideView) -> go.Figure:
    traces = []
    for view, name, color in ((dflash, "DFlash", DFLASH_COLOR), (plain, "plain", PLAIN_COLOR)):
        points = [(t, n / t) for t, n in view.timeline if t > 0]
        if points:
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": name,
                    "line": {"color": color},
                    "x": [p[0] for p in points],
                    "y": [p[1] for p in points],
                }
            )
    return _figure("Tokens per second over time", "compute time (s)", "tokens/s", traces)


def histogram_figure(view: SideView) -> go.Figure:
    summary = view.as_summary()
    traces = []
    if summary is not None and summary.blocks:
        counts = summary.acceptance_histogram
        traces.append(
            {
                "type": "bar",
                "x": list(range(1, len(counts))),
                "y": counts[1:],
                "name": "blocks",
                "marker": {"color": DFLASH_COLOR},
            }
        )
    return _figure("Histogram of acceptance lengths", "acceptance length", "blocks", traces, xaxis={"dtick": 1})


def position_figure(view: SideView) -> go.Figure:
    summary = view.as_summary()
    traces = []
    if summary is not None and summary.blocks and summary.block_size > 1:
        rates = summary.per_position_acceptance
        traces.append(
            {
                "type": "bar",
                "x": list(range(1, len(rates) + 1)),
                "y": rates,
                "name": "accepted",
                "marker": {"color": DFLASH_COLOR},
            }
        )
    return _figure(
        "Acceptance rate per draft position",
        "slot in block",
        "accepted fraction",
        traces,
        xaxis={"dtick": 1},
        yaxis={"range": [0, 1.05]},
    )
