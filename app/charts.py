"""Plotly figures of a race, rebuilt from the blocks shown so far (so they grow live).

Metrics come from the engine's `Summary` properties (over a provisional summary while running),
so the charts and the trace download always agree.
"""

from __future__ import annotations

import plotly.graph_objects as go

from .race import SideView

DFLASH_COLOR = "#2f9e44"
PLAIN_COLOR = "#4c6ef5"


def _figure(title: str, x_title: str, y_title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        height=260,
        margin={"l": 50, "r": 10, "t": 40, "b": 40},
        xaxis_title=x_title,
        yaxis_title=y_title,
        template="plotly_white",
        legend={"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"},
        uirevision="race",  # keep the user's zoom while frames stream in
    )
    return fig


def _waiting(fig: go.Figure) -> go.Figure:
    fig.add_annotation(text="waiting for blocks…", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def acceptance_figure(view: SideView) -> go.Figure:
    fig = _figure("Acceptance length per block", "block", "tokens accepted (incl. bonus)")
    if not view.blocks:
        return _waiting(fig)
    lengths = [b.acceptance_length for b in view.blocks]
    running = [sum(lengths[: i + 1]) / (i + 1) for i in range(len(lengths))]
    x = list(range(len(lengths)))
    fig.add_bar(x=x, y=lengths, name="acceptance length", marker_color=DFLASH_COLOR, opacity=0.7)
    fig.add_scatter(x=x, y=running, name=f"tau (running mean) = {running[-1]:.2f}", mode="lines", line_color="#222")
    fig.update_yaxes(range=[0, view.block_size + 0.5])
    return fig


def speed_figure(dflash: SideView, plain: SideView) -> go.Figure:
    fig = _figure("Tokens per second over time", "compute time (s)", "tokens/s")
    if not dflash.timeline and not plain.timeline:
        return _waiting(fig)
    for view, name, color in ((dflash, "DFlash", DFLASH_COLOR), (plain, "plain", PLAIN_COLOR)):
        points = [(t, n / t) for t, n in view.timeline if t > 0]
        fig.add_scatter(x=[p[0] for p in points], y=[p[1] for p in points], name=name, mode="lines", line_color=color)
    return fig


def histogram_figure(view: SideView) -> go.Figure:
    fig = _figure("Histogram of acceptance lengths", "acceptance length", "blocks")
    summary = view.as_summary()
    if summary is None or not summary.blocks:
        return _waiting(fig)
    counts = summary.acceptance_histogram
    fig.add_bar(x=list(range(1, len(counts))), y=counts[1:], marker_color=DFLASH_COLOR, name="blocks")
    fig.update_xaxes(dtick=1)
    return fig


def position_figure(view: SideView) -> go.Figure:
    fig = _figure("Acceptance rate per draft position", "slot in block", "accepted fraction")
    summary = view.as_summary()
    if summary is None or not summary.blocks or summary.block_size < 2:
        return _waiting(fig)
    rates = summary.per_position_acceptance
    fig.add_bar(x=list(range(1, len(rates) + 1)), y=rates, marker_color=DFLASH_COLOR, name="accepted")
    fig.update_yaxes(range=[0, 1.05])
    fig.update_xaxes(dtick=1)
    return fig
