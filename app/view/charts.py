"""Plotly figures of a race, rebuilt from the blocks shown so far (so they grow live), one trace per
lane in the lane's color.

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

from ..race.interleave import SideView
from ..race.lanes import COLORS, LABELS


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


def acceptance_figure(lanes: dict[str, SideView]) -> go.Figure:
    """Per drafting lane (by name): each block's acceptance length (bars, one lane alone) and the
    running tau; for the scheduled lane also each block's verified length, the length its block
    schedule chose (dotted steps)."""
    traces = []
    alone = len(lanes) == 1
    for name, view in lanes.items():
        lengths = [b.acceptance_length for b in view.blocks]
        if not lengths:
            continue
        running = [total / (i + 1) for i, total in enumerate(accumulate(lengths))]  # linear: a long trace stays cheap
        x = list(range(len(lengths)))
        if alone:  # with several lanes the bars would hide each other; their running means say it
            traces.append({"type": "bar", "x": x, "y": lengths, "name": "acceptance length",
                           "marker": {"color": COLORS[name]}, "opacity": 0.7})
        label = "tau (running mean)" if alone else f"{LABELS[name]} tau"
        traces.append({"type": "scatter", "x": x, "y": running, "mode": "lines", "name": f"{label} = {running[-1]:.2f}",
                       "line": {"color": "#222" if alone else COLORS[name]}})
        if name == "scheduled":
            traces.append(_verified_trace(view))
    top = max((view.block_size for view in lanes.values()), default=1)
    return _figure(
        "Acceptance length per block", "block", "tokens accepted (incl. bonus)", traces, yaxis={"range": [0, top + 0.5]},
    )


def _verified_trace(view: SideView) -> dict:
    """The scheduled lane's verified tokens per block (slot 0 and the verified drafts): the block
    length its schedule chose each cycle, and their mean."""
    lengths = [b.verified + 1 for b in view.blocks]
    return {"type": "scatter", "x": list(range(len(lengths))), "y": lengths, "mode": "lines", "line": {
        "color": COLORS["scheduled"], "dash": "dot", "shape": "hvh"},
        "name": f"scheduled block: verified per cycle (mean {sum(lengths) / len(lengths):.1f})"}


def speed_figure(lanes: dict[str, SideView]) -> go.Figure:
    """Every lane's tokens per second over its own compute time."""
    traces = []
    for name, view in lanes.items():
        points = [(t, n / t) for t, n in view.timeline if t > 0]
        if points:
            traces.append({
                "type": "scatter", "mode": "lines", "name": LABELS[name] if name != "dflash" else "DFlash",
                "line": {"color": COLORS[name]}, "x": [p[0] for p in points], "y": [p[1] for p in points],
            })
    return _figure("Tokens per second over time", "compute time (s)", "tokens/s", traces)


def histogram_figure(lanes: dict[str, SideView]) -> go.Figure:
    """Per drafting lane, how many blocks had each acceptance length."""
    traces = []
    for name, view in lanes.items():
        summary = view.as_summary()
        if summary is not None and summary.blocks:
            counts = summary.acceptance_histogram
            traces.append({"type": "bar", "x": list(range(1, len(counts))), "y": counts[1:],
                           "name": "blocks" if len(lanes) == 1 else LABELS[name], "marker": {"color": COLORS[name]}})
    return _figure("Histogram of acceptance lengths", "acceptance length", "blocks", traces, xaxis={"dtick": 1})


def position_figure(lanes: dict[str, SideView]) -> go.Figure:
    """Per drafting lane, the fraction of cycles whose draft slot k was accepted."""
    traces = []
    for name, view in lanes.items():
        summary = view.as_summary()
        if summary is not None and summary.blocks and summary.block_size > 1:
            rates = summary.per_position_acceptance
            traces.append({"type": "bar", "x": list(range(1, len(rates) + 1)), "y": rates,
                           "name": "accepted" if len(lanes) == 1 else LABELS[name], "marker": {"color": COLORS[name]}})
    return _figure(
        "Acceptance rate per draft position", "slot in block", "accepted fraction", traces,
        xaxis={"dtick": 1}, yaxis={"range": [0, 1.05]},
    )
