"""The Replay tab's handler: a recorded race streamed through the live race's frames.

The recorded events run through the same race, paced by their recorded compute clocks at a
multiple of real time, under the viewer's Pause / Step / Continue; no model is needed.
"""

from __future__ import annotations

import gradio as gr

from . import texts
from .control import Controls
from .frames import ChartPacer, race_frame, start_frame
from .race import race
from .replay import RecordedPieces, ReplayError, load_trace


class Playback:
    def __init__(self, controls: Controls):
        self.controls = controls  # each session's Pause / Step / Continue

    def replay(self, shipped, uploaded, speed, request: gr.Request = None):
        """Stream a recorded race, paced by its recorded compute clocks at `speed` times real time."""
        source = uploaded or shipped
        try:
            recording = load_trace(source)
            speed = float(speed)
            if not 0.25 <= speed <= 4.0:
                raise ReplayError(texts.BAD_SPEED.format(speed=speed))
        except (ReplayError, TypeError, ValueError) as exc:
            raise gr.Error(str(exc)) from None
        control = self.controls.get(getattr(request, "session_hash", None))
        run = control.reset()
        control.viewer.text_of = recording.text_of
        yield start_frame(texts.REPLAY_START.format(label=recording.label(), speed=speed)).values()
        pieces = {side: RecordedPieces(recording, side) for side in ("dflash", "plain")}
        running = texts.REPLAYING.format(name=recording.name, speed=speed)
        pacer = ChartPacer()
        snapshot = None
        for snapshot in race(
            recording.events("dflash"), recording.events("plain"), dflash_block_size=recording.block_size,
            speed=speed, control=control, stop=lambda: control.superseded(run),
        ):
            with_charts = pacer.due(snapshot)
            if snapshot.stopped:
                return  # a newer replay or race of this viewer took over the panes
            if not snapshot.done:
                yield race_frame(
                    snapshot, pieces, recording.text_of, None, with_charts, control.viewer, running=running
                ).values()
        note = texts.REPLAY_NOTE.format(name=recording.name)
        yield race_frame(snapshot, pieces, recording.text_of, recording.report(), True, control.viewer, note=note).values()
