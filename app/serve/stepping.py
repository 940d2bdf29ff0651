"""Pause, Step and Continue, and the cycle picker: the handlers that act on what one viewer has
on screen (their `Control` and its `Viewer`), for a live race and a replay alike."""

from __future__ import annotations

import gradio as gr

from ..race.control import Control, Controls
from ..view import texts
from ..view.cycle_view import cycle_html


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
        return texts.PAUSED.format(cycle=control.viewer.shown)

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

    def pick_cycle(self, index, request: gr.Request = None):
        """Show the chosen cycle of the run on screen, and stop following the latest one."""
        viewer = self.control(request).viewer
        viewer.follow = False
        if viewer.latest is None:
            return cycle_html(None, None, None, str), False
        return cycle_html(viewer.latest.dflash, viewer.latest.plain, index, viewer.text_of, viewer.latest.lanes.get("ar")), False

    def follow_latest(self, follow, request: gr.Request = None):
        viewer = self.control(request).viewer
        viewer.follow = bool(follow)
        if viewer.latest is None or not follow:
            return gr.skip()
        return cycle_html(viewer.latest.dflash, viewer.latest.plain, None, viewer.text_of, viewer.latest.lanes.get("ar"))
