"""A finished race kept beside the next ones: its settings, each lane's numbers and its DFlash text.

The pinned panel is drawn once, when the race is pinned, from what the viewer had on screen (the
finished snapshot, its report and the pane text of its tokens), so that it needs neither the race
nor its pair afterwards: it stays as it was whatever races, pairs or errors follow.
"""

from __future__ import annotations

import html

from ..race.lanes import COLORS, LABELS
from ..race.report import RaceReport
from .render import lane_marks, tokens_html


def run_label(source: str, settings: str, prompt: str) -> str:
    """The line naming a run: where it came from (a pair, a recording), its settings, its prompt."""
    prompt = " ".join(str(prompt).split())
    prompt = prompt if len(prompt) <= 60 else prompt[:57] + "…"
    return f"{source} · {settings} · “{prompt}”"


def _rows(report: RaceReport) -> list[tuple[str, str, str, str]]:
    """(lane, tok/s, tau, speedup) of every lane raced; a report without lanes gives DFlash and plain."""
    if report.lanes:
        return [(name, f"{lane.tok_s:.1f}", f"{lane.tau:.2f}" if name != "plain" else "1", f"{lane.speedup:.2f}×")
                for name, lane in report.lanes.items()]
    return [("dflash", f"{report.dflash_tok_s:.1f}", f"{report.tau:.2f}", f"{report.speedup:.2f}×"),
            ("plain", f"{report.plain_tok_s:.1f}", "1", "1.00×")]


def pinned_html(label: str, report: RaceReport, snap, pieces, text_of) -> str:
    """The panel of a finished race (`snap`, `report`) named by `label`: a table of its lanes' tok/s,
    tau and speedup, then DFlash's text with its kept drafts and bonus tokens marked, as in its pane."""
    rows = "".join(
        f'<tr><td style="color:{COLORS.get(name, "#111")};font-weight:600">{html.escape(LABELS.get(name, name))}</td>'
        f"<td>{tok_s}</td><td>{tau}</td><td>{speedup}</td></tr>"
        for name, tok_s, tau, speedup in _rows(report)
    )
    view = snap.dflash
    text = tokens_html(lane_marks(view), pieces["dflash"].extend(view.output_ids), text_of)
    stopped = " (stopped)" if report.stopped else ""
    same = {True: "every lane's text is plain decoding's", False: "a lane's text differs from plain decoding's"}.get(
        report.identical, "not checked against plain decoding")
    return (
        f'<div class="pinned-race"><div class="pinned-head"><b>Pinned race{stopped}</b> · {html.escape(label)}'
        f"</div><table class=\"pinned-lanes\"><tr><th>lane</th><th>tok/s</th><th>tau</th><th>speedup</th></tr>{rows}"
        f'</table><div class="pinned-note">{report.cycles} DFlash cycles; {same}. DFlash’s text:</div>{text}</div>'
    )


PINNED_CSS = """
.pinned-race { font-size: 14px; color: #111; }
.pinned-head { margin: 2px 0 4px; }
.pinned-lanes { border-collapse: collapse; margin: 2px 0 4px; }
.pinned-lanes td, .pinned-lanes th { padding: 1px 8px 1px 0; text-align: left; }
.pinned-lanes th { color: #667; font-weight: 500; }
.pinned-note { color: #556; font-size: 12px; margin: 2px 0 4px; }
"""
