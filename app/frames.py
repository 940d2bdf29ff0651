"""The race's outputs as frames: the `Frame` dataclass, and the code that builds one from a snapshot.

A frame is one update of every output of a race (live or replayed), in the order of the `compare`
endpoint's outputs. Frames are plain data, so that they cross process boundaries (ZeroGPU) by
pickle. The charts and the hover boxes are heavy to ship, so they go out only in some frames.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import gradio as gr

from . import charts, render, texts
from .control import PAUSE_EXPIRED, Control, Viewer
from .cycle_view import cycle_html
from .race import Snapshot
from .report import RaceReport
from .speedup import speedup_figure

CHART_EVERY_S = 0.4  # plotly figures are heavy to ship; text frames go out more often


def _keep():
    return field(default_factory=gr.skip)


@dataclass
class Frame:
    """One update of the race's outputs; a field left at its default (`gr.skip()`) keeps what is shown."""

    summary: object = _keep()  # HTML of the summary numbers, or of a status line
    dflash_stats: object = _keep()
    dflash_tokens: object = _keep()
    dflash_strip: object = _keep()
    plain_stats: object = _keep()
    plain_tokens: object = _keep()
    acceptance_chart: object = _keep()  # plotly figures
    speed_chart: object = _keep()
    histogram_chart: object = _keep()
    positions_chart: object = _keep()
    speedup_chart: object = _keep()
    cycle_pick: object = _keep()  # the cycle slider's update
    cycle_view: object = _keep()
    control_status: object = _keep()
    trace_csv: object = _keep()  # file paths
    report: object = _keep()  # the report's JSON (`RaceReport.to_dict`)
    trace_file: object = _keep()

    def values(self) -> tuple:
        return tuple(getattr(self, name) for name in FRAME_FIELDS)


FRAME_FIELDS = tuple(f.name for f in fields(Frame))


class ChartPacer:
    """Says which frames carry the charts: a frame when the race pauses or ends, else at most one
    every `every_s`. The pacer starts counting when it is made, so the first frames carry text
    only and the first tokens are not held up by figures."""

    def __init__(self, every_s: float = CHART_EVERY_S, clock=time.perf_counter):
        self.every_s, self.clock = every_s, clock
        self.last = clock()

    def due(self, snapshot: Snapshot) -> bool:
        now = self.clock()
        if snapshot.done or snapshot.paused or now - self.last >= self.every_s:
            self.last = now
            return True
        return False


def start_frame(text: str) -> Frame:
    """The frame a race opens with: empty panes and `text`, so old tokens and numbers never mix
    with new ones. The charts are kept until the first chart frame: rebuilding them now costs time."""
    waiting = render.tokens_html([], [], str)
    return Frame(
        summary=render.summary_html(None, text), dflash_stats="", dflash_tokens=waiting, dflash_strip="",
        plain_stats="", plain_tokens=waiting, report=gr.update(value=None), trace_file=gr.update(value=None),
        trace_csv=gr.update(value=None),
    )


def released_text(snapshot: Snapshot | None, control: Control | None) -> str | None:
    """The line saying why a paused race was let go, when that is how `snapshot` ended."""
    if snapshot is None or snapshot.released is None:
        return None
    if snapshot.released == PAUSE_EXPIRED:
        return texts.PAUSE_EXPIRED.format(seconds=getattr(control, "max_pause_s", None) or 0)
    return texts.EVICTED


def note_frame(text: str) -> Frame:
    """Only the summary line changes, to `text`."""
    return Frame(summary=render.summary_html(None, text))


def race_frame(
    snap: Snapshot, pieces, text_of, report: RaceReport | None, with_charts: bool, viewer: Viewer | None = None,
    note: str | None = None, running: str | None = None,
) -> Frame:
    """The frame that shows `snap`; `report` once the race has finished.

    pieces: per side, the pane text of its tokens (`extend(ids)`, see `tokens.py`).
    viewer: the viewer's state, where Pause / Step reach the race: `snap` becomes its latest, and
    the frame carries the cycle view and the control status line.
    note: the line under the summary numbers; running: the status line while the race runs.
    """
    d, p = snap.dflash, snap.plain
    frame = _panes(snap, pieces, text_of, report)
    if note is None:
        note = "" if report is None else texts.OWN_CLOCKS
    if report is not None and report.stopped:
        note = texts.STOPPED_SHOWN.format(dflash=d.num_tokens, plain=p.num_tokens) + note
    frame.summary = render.summary_html(report, note) if report else render.summary_html(None, running or texts.RACING)
    if with_charts:
        frame.acceptance_chart = charts.acceptance_figure(d)
        frame.speed_chart = charts.speed_figure(d, p)
        frame.histogram_chart = charts.histogram_figure(d)
        frame.positions_chart = charts.position_figure(d)
    if report is not None or snap.paused:  # a model of the whole run: drawn when it stands still
        frame.speedup_chart = speedup_figure(d.as_summary(), p.as_summary(), None if report is None else report.speedup)
    if viewer is not None:
        _show_to(viewer, frame, snap, text_of, report, with_charts)
    return frame


def _panes(snap: Snapshot, pieces, text_of, report: RaceReport | None) -> Frame:
    """Both panes' stats, tokens and the draft strip; the report's JSON and no trace file yet."""
    diff = None if report is None else report.first_difference
    d, p = snap.dflash, snap.plain
    # Hover boxes with top-k lists are heavy; they go out when the viewer can hover: paused or done.
    tips = snap.paused or report is not None
    d_tips = render.dflash_tips(d, text_of) if tips else None
    p_tips = render.plain_tips(p, text_of) if tips else None
    return Frame(
        dflash_stats=render.side_stats_html(d, f"DFlash (block {d.block_size})"),
        dflash_tokens=render.tokens_html(render.dflash_marks(d), pieces["dflash"].extend(d.output_ids), text_of, diff, d_tips),
        dflash_strip=render.draft_strip_html(d, text_of, tips=tips),
        plain_stats=render.side_stats_html(p, "Plain decoding"),
        plain_tokens=render.tokens_html(render.plain_marks(p), pieces["plain"].extend(p.output_ids), text_of, diff, p_tips),
        report=None if report is None else report.to_dict(),
        trace_file=None,
    )


def _show_to(viewer: Viewer, frame: Frame, snap: Snapshot, text_of, report: RaceReport | None, with_charts: bool) -> None:
    d = snap.dflash
    viewer.latest = snap
    # The cycle view goes out with the charts (a few times a second), not with every frame.
    if viewer.follow and d.blocks and with_charts:
        frame.cycle_view = cycle_html(d, snap.plain, None, text_of)
        frame.cycle_pick = gr.update(maximum=max(len(d.blocks) - 1, 1), value=len(d.blocks) - 1)
    if snap.paused:
        frame.control_status = texts.PAUSED_AT.format(cycle=len(d.blocks))
    elif report is not None:
        frame.control_status = texts.FINISHED
