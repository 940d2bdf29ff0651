"""The handlers a class needs beside the race's own: start a run paused before its first cycle,
step the cycle view (and, in a run that stands still, every pane) back and forth, and clear what an
earlier run left on screen.

They act on the caller's `Control` (the same one Pause / Step use) and answer at once (no queue).
"""

from __future__ import annotations

import gradio as gr

from ..race.control import Controls
from ..view import texts
from ..view.frames import blank_frame
from .stepping import NOTHING_TO_LOOK_AT, cycle_index, look_at


class Lecture:
    def __init__(self, controls: Controls):
        self.controls = controls

    def _playing(self, request) -> bool:
        control = self.controls.find(getattr(request, "session_hash", None))
        return control is not None and control.active

    def clear(self, request: gr.Request = None):
        """Every race output blank, unless a run of this session is playing (its frames own them)."""
        if self._playing(request):
            return tuple(gr.skip() for _ in blank_frame().values())
        control = self.controls.find(getattr(request, "session_hash", None))
        if control is not None:
            control.viewer.latest = None  # the cycle picker has nothing to show either
            control.viewer.back_at = None
        return blank_frame().values()

    def before_run(self, start_paused, request: gr.Request = None):
        """Race or Replay was clicked: with `start_paused`, the run about to start holds before cycle 1;
        what an earlier run left on screen goes (an error then stands alone, over nothing old)."""
        if start_paused is True:
            self.controls.get(getattr(request, "session_hash", None)).arm()
        return self.clear(request)

    def step_when_idle(self, request: gr.Request = None):
        """Step with nothing playing: the next run (started by the page at once) holds before cycle 1."""
        if self._playing(request):
            return gr.skip()
        self.controls.get(getattr(request, "session_hash", None)).arm()
        return texts.STARTING_PAUSED

    def switch_source(self, source: str, shown, request: gr.Request = None):
        """The Live race or Replay tab was picked: the area empties if it shows the other one's run
        (`shown`, the source of the last run started here); returns the new `shown` and the outputs."""
        if shown in (None, source) or self._playing(request):
            return (shown, *(gr.skip() for _ in blank_frame().values()))
        return (None, *self.clear(request))

    def switcher(self, source: str):
        """`switch_source` for the tab of `source`, as a handler (Gradio passes the request by annotation)."""

        def switch(shown, request: gr.Request = None):
            return self.switch_source(source, shown, request)

        return switch

    def best_cycle(self, request: gr.Request = None):
        """The cycle view at the lane's cycle that committed the most tokens (the first such)."""
        return self._extreme(max, request)

    def worst_cycle(self, request: gr.Request = None):
        """The cycle view at the lane's cycle that committed the fewest tokens (the first such)."""
        return self._extreme(min, request)

    def _extreme(self, pick, request):
        control = self.controls.find(getattr(request, "session_hash", None))
        snap = control.viewer.latest if control is not None else None
        view = snap.lanes.get(control.viewer.lane) if snap is not None else None
        if view is None or not view.blocks:
            return NOTHING_TO_LOOK_AT
        lengths = [block.acceptance_length for block in view.blocks]
        return look_at(control, lengths.index(pick(lengths)))

    def previous_cycle(self, number, request: gr.Request = None):
        return self.shift_cycle(-1, number, request)

    def next_cycle(self, number, request: gr.Request = None):
        return self.shift_cycle(1, number, request)

    def shift_cycle(self, delta, number, request: gr.Request = None):
        """Cycle `number` (counted from 1) of the lane's cycles shown, moved by `delta` within them
        (`look_at`: in a paused or ended run, every pane goes with it)."""
        control = self.controls.find(getattr(request, "session_hash", None))
        snap = control.viewer.latest if control is not None else None
        view = snap.lanes.get(control.viewer.lane) if snap is not None else None
        if view is None or not view.blocks:
            return NOTHING_TO_LOOK_AT
        last = len(view.blocks) - 1
        index = cycle_index(number)
        index = index if isinstance(index, int) and 0 <= index <= last else last
        return look_at(control, min(max(index + int(delta), 0), last))
