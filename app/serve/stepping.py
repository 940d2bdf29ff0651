"""Pause, Step and Continue, and the cycle and lane pickers: the handlers that act on what one viewer
has on screen (their `Control` and its `Viewer`), for a live race and a replay alike.

A cycle picked in a run that stands still (paused, or ended) moves every lane's pane to the race as
it stood after that cycle, not only the cycle view (`look_at`); in a playing run only the cycle view
moves, since the run's frames own the panes.
"""

from __future__ import annotations

import gradio as gr

from ..race.control import Control, Controls
from ..race.lanes import CYCLE_LANES
from ..view import texts
from ..view.frames import FRAME_FIELDS, look_back_frame, paused_line
from ..view.lane_cycles import lane_cycle_html

# What `look_at` answers: the "Follow the current cycle" checkbox, then the race's outputs (`FRAME_FIELDS`).
NOTHING_TO_LOOK_AT = (gr.skip(),) * (1 + len(FRAME_FIELDS))


def cycle_index(number):
    """The 0-based index of the cycle the picker names (counted from 1); anything else is passed on,
    and the cycle view shows the latest cycle for it."""
    try:
        return int(number) - 1
    except (TypeError, ValueError, OverflowError):
        return number


def look_at(control: Control, index) -> tuple:
    """The answer of every cycle picker (the slider, ← / →, best / worst, a lesson's stops): cycle
    `index` (0-based; None or out of range: the last shown) of the viewer's lane, as the follow
    checkbox and the race's outputs (`NOTHING_TO_LOOK_AT` when no cycle of that lane is on screen)."""
    viewer = control.viewer
    snap = viewer.latest
    view = snap.lanes.get(viewer.lane) if snap is not None else None
    if view is None or not view.blocks:
        return NOTHING_TO_LOOK_AT
    last = len(view.blocks) - 1
    index = index if isinstance(index, int) and 0 <= index <= last else last
    paused = control.active and control.paused
    still = paused or not control.active
    frame = look_back_frame(viewer, index, still, paused)
    viewer.follow = still and index == last  # back where the run stands: the view follows it again
    return (viewer.follow, *frame.values())


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
        Also returns the follow checkbox: ticked when the panes were stepped back (the run moves on
        from where it paused, and the views follow it).

        A status returned here could reach the page after that frame (a busy CPU delays this
        handler's reply more than the stream) and leave a stale "stepping" on screen.
        """
        control = self.control(request)
        control.step(control.viewer.shown)
        return gr.update(), self._follow_again(control)

    def resume(self, request: gr.Request = None):
        control = self.control(request)
        control.resume()
        return texts.PLAYING, self._follow_again(control)

    @staticmethod
    def _follow_again(control: Control):
        if control.viewer.back_at is None:
            return gr.skip()
        control.viewer.follow = True
        return True

    def pick_cycle(self, number, request: gr.Request = None):
        """Show cycle `number` (counted from 1) of the run on screen (`look_at`)."""
        return look_at(self.control(request), cycle_index(number))

    def follow_latest(self, follow, request: gr.Request = None):
        """The follow checkbox: ticked, the views go back to the run's latest cycle (`look_at`)."""
        control = self.control(request)
        control.viewer.follow = bool(follow)
        if control.viewer.latest is None or not follow:
            return NOTHING_TO_LOOK_AT
        return look_at(control, None)

    def pick_lane(self, lane, request: gr.Request = None):
        """Lay out the cycles of `lane` (one of `CYCLE_LANES`, else DFlash's) from now on: its latest
        cycle, with the cycle slider over its cycles, and the panes back at the run's latest."""
        control = self.control(request)
        viewer = control.viewer
        # The panes stepped back on the lane left come back to the run's latest first.
        back = look_at(control, None) if viewer.back_at is not None else NOTHING_TO_LOOK_AT
        viewer.lane = lane if lane in CYCLE_LANES else "dflash"
        snap = viewer.latest
        view = None if snap is None else snap.lanes.get(viewer.lane)
        if view is None or not view.blocks:
            back = list(back)
            back[1 + FRAME_FIELDS.index("cycle_view")] = lane_cycle_html(snap, viewer.lane, None, viewer.text_of,
                                                                         viewer.prompt_ids)
            return tuple(back)
        return look_at(control, None)
