"""The serving view's figure and table: throughput and latency against concurrency, DFlash beside plain.

Both take the levels of a concurrency sweep as its JSON gives them (`Level.to_dict()` of
`dflash_core.vllm.sweep`), so the app's live sweep and a recorded run
(`dev/measurements/concurrency-*.json`) draw the same way. Levels not run (the time budget, a
stop) are left out of the curves and named in the table.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

from ..race.lanes import COLORS, LABELS
from .charts import _template

SIDES = (("dflash", "DFlash"), ("plain", LABELS["plain"]))


def _measured(levels: list[dict]) -> list[dict]:
    return [lv for lv in levels if lv.get("plain") and lv.get("dflash") and lv["plain"]["finished"]
            and lv["dflash"]["finished"]]


def serving_figure(levels: list[dict], title: str = "Serving: throughput and latency against concurrency",
                   height: int = 340) -> go.Figure:
    """Two panels over the concurrency levels (log 2 axis): total output tok/s, with DFlash's speedup
    over plain at each point, and a request's mean latency (p90 dotted), DFlash and plain decoding."""
    measured = _measured(levels)
    x = [lv["level"] for lv in measured]
    traces = []
    for side, label in SIDES:
        color = COLORS[side]
        runs = [lv[side] for lv in measured]
        speedups = [f"{lv['speedup']:.2f}x" if side == "dflash" and lv.get("speedup") else "" for lv in measured]
        traces.append({"type": "scatter", "x": x, "y": [r["tok_s"] for r in runs],
                       "name": f"{label} (labels: speedup over plain)" if side == "dflash" else label,
                       "legendgroup": side, "mode": "lines+markers+text" if side == "dflash" else "lines+markers",
                       "text": speedups, "textposition": "top center", "line": {"color": color},
                       "xaxis": "x", "yaxis": "y"})
        traces.append({"type": "scatter", "x": x, "y": [r["mean_latency_s"] for r in runs], "name": f"{label}, mean",
                       "legendgroup": side, "showlegend": False, "mode": "lines+markers", "line": {"color": color},
                       "xaxis": "x2", "yaxis": "y2"})
        traces.append({"type": "scatter", "x": x, "y": [r["p90_latency_s"] for r in runs], "name": f"{label}, p90",
                       "legendgroup": side, "showlegend": False, "mode": "lines",
                       "line": {"color": color, "dash": "dot"}, "xaxis": "x2", "yaxis": "y2"})
    ticks = [lv["level"] for lv in levels]
    axis = {"type": "log", "tickvals": ticks, "ticktext": [str(t) for t in ticks], "title": {"text": "concurrency"}}
    layout = {
        "title": {"text": title, "font": {"size": 14}}, "height": height, "template": _template(),
        "margin": {"l": 55, "r": 15, "t": 60, "b": 45},
        "legend": {"orientation": "h", "y": 1.08, "x": 1, "xanchor": "right", "yanchor": "bottom"},
        "xaxis": {**axis, "domain": [0, 0.45]}, "xaxis2": {**axis, "domain": [0.57, 1], "anchor": "y2"},
        "yaxis": {"title": {"text": "output tok/s, all requests"}, "rangemode": "tozero"},
        "yaxis2": {"title": {"text": "latency per request (s; p90 dotted)"}, "rangemode": "tozero", "anchor": "x2"},
    }
    if not measured:
        layout["annotations"] = [{"text": "no level measured yet", "showarrow": False, "xref": "paper",
                                  "yref": "paper", "x": 0.5, "y": 0.5}]
    return go.Figure({"data": traces, "layout": layout}, _validate=False)


def _num(value, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def serving_table_html(levels: list[dict]) -> str:
    """One row per level: requests, tok/s, speedup, latencies, vLLM's acceptance length, outputs equal."""
    head = ("<tr><th>concurrency</th><th>requests</th><th>plain tok/s</th><th>DFlash tok/s</th><th>speedup</th>"
            "<th>plain latency mean / p90 (s)</th><th>DFlash latency mean / p90 (s)</th>"
            "<th>acceptance length</th><th>DFlash = plain</th></tr>")
    rows = []
    for lv in levels:
        p, d = lv.get("plain"), lv.get("dflash")
        note = f"<br><small>{html.escape(lv['note'])}</small>" if lv.get("note") else ""
        if p is None or d is None:
            rows.append(f"<tr><td>{lv['level']}</td><td colspan='8'>{html.escape(lv.get('note') or '')}</td></tr>")
            continue
        speedup = f"{lv['speedup']:.2f}x" if lv.get("speedup") else "–"
        rows.append(
            f"<tr><td>{lv['level']}</td><td>{d['requests']}{note}</td><td>{p['tok_s']:.1f}</td><td>{d['tok_s']:.1f}</td>"
            f"<td><b>{speedup}</b></td><td>{_num(p['mean_latency_s'], '.1f')} / {_num(p['p90_latency_s'], '.1f')}</td>"
            f"<td>{_num(d['mean_latency_s'], '.1f')} / {_num(d['p90_latency_s'], '.1f')}</td>"
            f"<td>{_num(d['acceptance_length'], '.2f')}</td><td>{lv['identical']}/{lv['compared']}</td></tr>")
    return f"<table class='serving-table'>{head}{''.join(rows)}</table>"
