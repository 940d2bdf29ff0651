"""Pause, Step and Continue, and the cycle and lane pickers: the handlers that act on what one viewer
has on screen (their `Control` and its `Viewer`), for a live race and a replay alike."""

from __future__ import annotations

import gradio as gr

from ..race.control import Control, Controls
from ..race.lanes import CYCLE_LANES
from ..view import texts
from ..view.cycle_view import lane_cycle_html
from ..view.frames import cycle_slider, paused_line


def cycle_index(number):
    """The 0-based index of the cycle the picker names (counted from 1); anything else is passed on,
    and the cycle view shows the latest cycle for it."""
    try:
        return int(number) - 1
    except (TypeError, ValueError, OverflowError):
        return number


class Stepping:
    def __init__(self, controls: Controls):
        self.controls = controls

    def control(self, request) -> Control:
        """The caller's control; a session that never raced gets a fresh one outside the table."""
        return self.controls.find(getattr(request, "session_hash", None)) or Control()

    def pause(self, request: gr.Request = None):
        control = self.control(request)
        if not control.active:
            return texts.NOTHING_TO_PAUSE
        control.pause(control.viewer.shown)
        return paused_line(control.viewer.shown)

    def step(self, request: gr.Request = None):
        """One more cycle; the status is left to the race's next frame ("Paused after cycle N").

        A status returned here could reach the page after that frame (a busy CPU delays this
        handler's reply more than the stream) and leave a stale "stepping" on screen.
        """
        control = self.control(request)
        control.step(control.viewer.shown)
        return gr.update()

    def resume(self, request: gr.Request = None):
        self.control(request).resume()
        return texts.PLAYING

    def pick_cycle(self, number, request: gr.Request = None):
        """Show cycle `number` (counted from 1) of the run on screen, and stop following the latest one."""
        viewer = self.control(request).viewer
        viewer.follow = False
        return lane_cycle_html(viewer.latest, viewer.lane, cycle_index(number), viewer.text_of), False

    def follow_latest(self, follow, request: gr.Request = None):
        viewer = self.control(request).viewer
        viewer.follow = bool(follow)
        if viewer.latest is None or not follow:
            return gr.skip()
        return lane_cycle_html(viewer.latest, viewer.lane, None, viewer.text_of)

    def pick_lane(self, lane, request: gr.Request = None):
        """Lay out the cycles of `lane` (one of `CYCLE_LANES`, else DFlash's) from now on: its latest
        cycle, with the cycle slider over its cycles."""
        viewer = self.control(request).viewer
        viewer.lane = lane if lane in CYCLE_LANES else "dflash"
        snap = viewer.latest
        view = None if snap is None else snap.lanes.get(viewer.lane)
        slider = gr.skip() if view is None or not view.blocks else cycle_slider(len(view.blocks))
        return lane_cycle_html(snap, viewer.lane, None, viewer.text_of), slider
