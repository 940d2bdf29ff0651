"""Pin a finished race and race again with it kept beside the new one.

A pin belongs to the tab it was made under (*Live race* or *Replay*): each tab shows only its own,
and at most one, which the next pin replaces. Pins live in the page's session state (`pins`, tab ->
the pinned panel's HTML, drawn once when pinned by `view/pinned.py`), so a new race, another pair
or an error leaves them as they are; only *Unpin* takes one away.
"""

from __future__ import annotations

import gradio as gr

from ..race.control import Controls
from ..view import texts
from ..view.pinned import pinned_html

TABS = ("live", "replay")  # the tabs that race, each with its own pin


def _shown(html: str | None):
    """The pinned panel's content and its column's update: shown where there is a pin."""
    return (html or "", gr.update(visible=bool(html)))


class Pinning:
    def __init__(self, controls: Controls):
        self.controls = controls

    def pin(self, tab, pins, request: gr.Request = None):
        """Pin the finished run on screen under `tab`; returns the pins, the panel and its column.
        With no finished run on screen, says so (a warning) and changes nothing."""
        control = self.controls.find(getattr(request, "session_hash", None))
        viewer = control.viewer if control is not None else None
        if tab not in TABS or viewer is None or control.active or viewer.latest is None or viewer.report is None:
            gr.Warning(texts.NOTHING_TO_PIN)
            return gr.skip(), gr.skip(), gr.skip()
        html = pinned_html(viewer.label or texts.UNNAMED_RUN, viewer.report, viewer.latest, viewer.pieces,
                           viewer.text_of)
        pins = {**(pins or {}), tab: html}
        return (pins, *_shown(html))

    @staticmethod
    def unpin(tab, pins):
        """Take the pin of `tab` away."""
        pins = {key: value for key, value in (pins or {}).items() if key != tab}
        return (pins, *_shown(None))

    @staticmethod
    def show(tab, pins):
        """The pin of `tab` (the tab just picked), or none."""
        return _shown((pins or {}).get(tab))
