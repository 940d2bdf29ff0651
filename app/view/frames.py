"""The race's outputs as frames: the `Frame` dataclass, and the code that builds one from a snapshot.

A frame is one update of every output of a race (live or replayed), in the order of the `compare`
endpoint's outputs (`FRAME_FIELDS`): every lane of `LANES` has a pane (its column's visibility, its
stats, tokens and draft strip) whether it races or not, so the outputs are the same for every race.
Frames are plain data, so that they cross process boundaries (ZeroGPU) by pickle. The charts and
the hover boxes are heavy to ship, so they go out only in some frames; every part of a frame stays
within its byte budget (`budget.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import gradio as gr

from ..race.control import PAUSE_EXPIRED, TIME_UP, Control, Viewer
from ..race.interleave import Snapshot
from ..race.lanes import LABELS, LANES, lane_title
from ..race.report import RaceReport
from ..race.rewind import as_of
from . import charts, render, texts
from .lane_cycles import lane_cycle_html
from .speedup import speedup_figure
from .why_speed import cycle_cost, why_html

# Plotly figures are heavy to draw (a chart frame redraws four): they go out at most this often
# while a race runs, text frames more often.
CHART_EVERY_S = 1.5
# The HTML a browser draws per second while a race runs, with the server on the same 2-core laptop
# (the classroom case): frames sent faster queue up in the page, and a click on Stop or Pause waits
# behind them (docs/app.md, "Responsiveness").
BROWSER_BYTES_PER_S = 300_000
# What a chart frame costs the browser beyond its HTML: plotly redraws every figure, which takes
# longer than any text frame (docs/app.md, "Responsiveness").
CHART_DRAW_S = 0.4


def _keep():
    return field(default_factory=gr.skip)


@dataclass
class Pane:
    """One lane's outputs in a frame."""

    column: object = _keep()  # the update of its column (shown while the lane races)
    stats: object = _keep()
    tokens: object = _keep()
    strip: object = _keep()


PANE_PARTS = tuple(f.name for f in fields(Pane))


@dataclass
class Frame:
    """One update of the race's outputs; a field left at its default (`gr.skip()`) keeps what is
    shown, and so does every part of a lane left out of `panes`."""

    summary: object = _keep()  # HTML of the summary numbers, or of a status line
    panes: dict[str, Pane] = field(default_factory=dict)  # by lane
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

    def html_bytes(self) -> int:
        """The bytes of HTML the frame sends (its text; the charts are paced apart)."""
        return html_bytes(self.values())

    def values(self) -> tuple:
        """The outputs in the order of `FRAME_FIELDS`."""
        out = []
        for name in _FIELDS:
            if name == "panes":
                for lane in LANES:
                    pane = self.panes.get(lane) or Pane()
                    out.extend(getattr(pane, part) for part in PANE_PARTS)
            else:
                out.append(getattr(self, name))
        return tuple(out)


_FIELDS = tuple(f.name for f in fields(Frame))
# The outputs' names: the frame's fields, each lane's pane spelled out as "<lane>_<part>".
FRAME_FIELDS = tuple(
    part for name in _FIELDS
    for part in ([f"{lane}_{p}" for lane in LANES for p in PANE_PARTS] if name == "panes" else [name])
)
# What an API client receives: the outputs but the columns (layout updates are not API values).
API_FIELDS = tuple(name for name in FRAME_FIELDS if not name.endswith("_column"))


def html_bytes(values: tuple) -> int:
    """The bytes of HTML in a frame's outputs."""
    return sum(len(value.encode()) for value in values if isinstance(value, str))


def draw_s(size: int, charts: bool = False, bytes_per_s: float = BROWSER_BYTES_PER_S) -> float:
    """Seconds a browser takes to draw a frame of `size` bytes of HTML, and its charts."""
    return size / bytes_per_s + (CHART_DRAW_S if charts else 0.0)


class FramePacer:
    """Says which snapshots of a running race become frames: after a frame, the next waits the time
    a browser takes to draw it (`draw_s`); a snapshot that pauses or ends the race is always drawn.
    Each frame redraws the panes whole, so a skipped snapshot loses nothing."""

    def __init__(self, bytes_per_s: float = BROWSER_BYTES_PER_S, clock=time.perf_counter):
        self.bytes_per_s, self.clock = bytes_per_s, clock
        self.next = float("-inf")

    def due(self, snapshot: Snapshot) -> bool:
        return snapshot.done or snapshot.paused or self.clock() >= self.next

    def wait(self, sleep=time.sleep) -> None:
        """Until the browser can have drawn the last frame."""
        sleep(max(0.0, self.next - self.clock()))

    def sent(self, size: int, started: float | None = None, charts: bool = False) -> None:
        """A frame of `size` bytes of HTML (and charts, if `charts`) went out; its time counts from
        `started` (default: now)."""
        start = self.clock() if started is None else started
        self.next = start + draw_s(size, charts, self.bytes_per_s)


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


def start_frame(text: str, lanes=("dflash", "plain")) -> Frame:
    """The frame a race of `lanes` opens with: their panes shown and empty, the others hidden, and
    `text`, so old tokens and numbers never mix with new ones. The charts are kept until the first
    chart frame: rebuilding them now costs time."""
    waiting = render.tokens_html([], [], str)
    panes = {
        lane: Pane(gr.update(visible=True), "", waiting, "") if lane in lanes else Pane(gr.update(visible=False), "", "", "")
        for lane in LANES
    }
    return Frame(
        summary=render.summary_html(None, text), panes=panes, report=gr.update(value=None),
        trace_file=gr.update(value=None), trace_csv=gr.update(value=None),
    )


def blank_frame(text: str = "") -> Frame:
    """Every output back to its state on a fresh page: no tokens, numbers, charts or cycle, so that
    nothing of an earlier run stays beside what comes next."""
    panes = {lane: Pane(gr.update(visible=lane in ("dflash", "plain")), "", "", "") for lane in LANES}
    return Frame(
        summary=render.summary_html(None, text), panes=panes, acceptance_chart=charts.acceptance_figure({}),
        speed_chart=charts.speed_figure({}), histogram_chart=charts.histogram_figure({}),
        positions_chart=charts.position_figure({}), speedup_chart=speedup_figure(None, None),
        cycle_pick=cycle_slider(1), cycle_view=lane_cycle_html(None, "dflash", None, str), control_status="",
        report=gr.update(value=None), trace_file=gr.update(value=None), trace_csv=gr.update(value=None),
    )


def released_text(snapshot: Snapshot | None, control: Control | None) -> str | None:
    """The line saying why a paused race was let go, when that is how `snapshot` ended."""
    if snapshot is None or snapshot.released is None:
        return None
    if snapshot.released == PAUSE_EXPIRED:
        return texts.PAUSE_EXPIRED.format(seconds=getattr(control, "max_pause_s", None) or 0)
    if snapshot.released == TIME_UP:
        return texts.TIME_UP.format(seconds=getattr(control, "max_run_s", None) or 0)
    return texts.EVICTED


def paused_line(cycles: int) -> str:
    """The control status of a run paused with `cycles` DFlash cycles on screen (cycles count from 1)."""
    return texts.PAUSED.format(cycle=cycles, next=cycles + 1) if cycles else texts.PAUSED_BEFORE


def cycle_slider(cycles: int, value: int | None = None):
    """The cycle picker's update over `cycles` cycles, numbered from 1, at `value` (default: the last).
    A slider needs two ends: over one cycle it spans 0 to 1 (0 shows the latest cycle too)."""
    return gr.update(minimum=1 if cycles > 1 else 0, maximum=max(cycles, 1), value=cycles if value is None else value)


def note_frame(text: str) -> Frame:
    """Only the summary line changes, to `text`."""
    return Frame(summary=render.summary_html(None, text))


def race_frame(
    snap: Snapshot, pieces, text_of, report: RaceReport | None, with_charts: bool, viewer: Viewer | None = None,
    note: str | None = None, running: str | None = None, hover: bool = True,
) -> Frame:
    """The frame that shows `snap`; `report` once the race has finished.

    pieces: per lane, the pane text of its tokens (`extend(ids)`, see `race/tokens.py`).
    viewer: the viewer's state, where Pause / Step reach the race: `snap` becomes its latest, and
    the frame carries the cycle view and the control status line.
    note: the line under the summary numbers; running: the status line while the race runs.
    hover: False leaves out the hover boxes a paused or finished race's frame carries (the titles stay).
    """
    d, p = snap.dflash, snap.plain
    frame = _panes(snap, pieces, text_of, report, hover)
    if note is None:
        note = "" if report is None else texts.OWN_CLOCKS
    if report is not None and report.stopped:
        note = texts.STOPPED_SHOWN.format(dflash=d.num_tokens, plain=p.num_tokens) + note
    frame.summary = render.summary_html(report, note) if report else render.summary_html(None, running or texts.RACING)
    if report is not None:
        frame.summary += why_html(cycle_cost(d.as_summary(), p.as_summary()), report.speedup)
    lanes = snap.lanes
    drafted = {name: view for name, view in lanes.items() if name != "plain"}
    if with_charts:
        frame.acceptance_chart = charts.acceptance_figure(drafted)
        frame.speed_chart = charts.speed_figure(lanes)
        frame.histogram_chart = charts.histogram_figure(drafted)
        frame.positions_chart = charts.position_figure(drafted)
    if report is not None or snap.paused:  # a model of the whole run: drawn when it stands still
        measured = None if report is None else {name: lane.speedup for name, lane in report.lanes.items()} or {
            "dflash": report.speedup}
        frame.speedup_chart = speedup_figure(
            {name: view.as_summary() for name, view in drafted.items()}, p.as_summary(), measured
        )
    if viewer is not None:
        _show_to(viewer, frame, snap, pieces, text_of, report, with_charts)
    return frame


def _panes(snap: Snapshot, pieces, text_of, report: RaceReport | None, hover: bool = True) -> Frame:
    """Every lane's stats, tokens and draft strip; the report's JSON and no trace file yet."""
    # Hover boxes with top-k lists are heavy; they go out when the viewer can hover: paused or done.
    still = snap.paused or report is not None
    tips = hover and still
    panes = {}
    # The plain pane outlines where any drafting lane first parts from it.
    others = "DFlash" if len(snap.lanes) == 2 else "a drafting lane"
    for name, view in snap.lanes.items():
        diff = _difference(report, name)
        plain = name == "plain"
        marks = render.plain_marks(view) if plain else render.lane_marks(view)
        hover = (render.plain_tips(view, text_of) if plain else render.lane_tips(view, text_of)) if tips else None
        panes[name] = Pane(
            stats=render.side_stats_html(view, lane_title(name, view.block_size)),
            tokens=render.tokens_html(marks, pieces[name].extend(view.output_ids), text_of, diff, hover,
                                      others if plain else LABELS[name]),
            strip="" if plain else render.draft_strip_html(
                view, text_of, render.STRIP_ROWS if still else render.RUNNING_STRIP_ROWS, tips=tips),
        )
    return Frame(panes=panes, report=None if report is None else report.to_dict(), trace_file=None)


def _difference(report: RaceReport | None, lane: str) -> int | None:
    """Where `lane` first differs from plain decoding (plain: where any lane does), to outline."""
    if report is None:
        return None
    if lane == "plain":
        return min((r.first_difference for r in report.lanes.values() if r.first_difference is not None),
                   default=report.first_difference)
    found = report.lanes.get(lane)
    return found.first_difference if found is not None else report.first_difference


def _show_to(viewer: Viewer, frame: Frame, snap: Snapshot, pieces, text_of, report: RaceReport | None,
             with_charts: bool) -> None:
    d = snap.dflash
    viewer.latest, viewer.pieces, viewer.report = snap, pieces, report
    if viewer.back_at is not None:  # the run moved on from a cycle stepped back to: the view follows it again
        viewer.back_at, viewer.follow = None, True
    shown = snap.lanes.get(viewer.lane, d)  # the lane the cycle view lays out, DFlash's count if it did not race
    # The cycle view goes out with the charts (a few times a second), not with every frame.
    if viewer.follow and shown.blocks and with_charts:
        frame.cycle_view = lane_cycle_html(snap, viewer.lane, None, text_of, viewer.prompt_ids)
        frame.cycle_pick = cycle_slider(len(shown.blocks))
    if snap.paused:
        frame.control_status = paused_line(len(d.blocks))
    elif report is not None:
        frame.control_status = texts.FINISHED


class _Prefix:
    """A lane's pane text for a prefix of its tokens: read off the pieces of its whole output shown
    (`full`), which the race's own pieces hold already, so that they are not decoded anew."""

    def __init__(self, pieces, full: list[int]):
        self.pieces, self.full = pieces, full

    def extend(self, ids) -> list[str]:
        ids = list(ids)
        if ids == self.full[: len(ids)]:
            return self.pieces.extend(self.full)[: len(ids)]
        return self.pieces.extend(ids)


def look_back_frame(viewer: Viewer, index: int, still: bool, paused: bool = False) -> Frame:
    """The run on screen (`viewer.latest`) with the cycle view and its picker at cycle `index`
    (0-based, within the cycles shown) of the viewer's lane.

    still: the run is paused or has ended; then every lane's pane goes with the cycle view, as the race
    stood after that cycle (`rewind.as_of`), and the status line says which cycle the panes show.
    At the lane's last cycle shown the panes are the run's latest, as it paused or ended (`paused`
    names which status line goes back). A playing run keeps its panes: its frames own them.
    """
    snap = viewer.latest
    lane = viewer.lane
    view = snap.lanes[lane]
    last = len(view.blocks) - 1
    frame = Frame(cycle_view=lane_cycle_html(snap, lane, index, viewer.text_of, viewer.prompt_ids),
                  cycle_pick=cycle_slider(last + 1, index + 1))
    if not still or viewer.pieces is None:
        return frame
    if index == last:
        viewer.back_at = None
        shown, report = snap, viewer.report
        frame.control_status = paused_line(len(snap.lead.blocks)) if paused else texts.FINISHED if report else ""
    else:
        viewer.back_at = index
        shown, report = as_of(snap, lane, index + 1), None
        whose = "" if lane == "dflash" else f" ({LABELS[lane]})"
        line = texts.BACK_AT_PAUSED if paused else texts.BACK_AT_ENDED
        frame.control_status = line.format(cycle=index + 1, last=last + 1, whose=whose)
    pieces = {name: _Prefix(viewer.pieces[name], snap.lanes[name].output_ids) for name in shown.lanes}
    frame.panes = _panes(shown, pieces, viewer.text_of, report).panes
    return frame
