"""DFlash Studio web app: a live race of DFlash speculative decoding against plain decoding.

The app only renders the events the engine (`dflash_core`) yields; it holds no decoding logic.
`python app.py` launches it; `app.ui.build_demo` builds the Gradio Blocks. Three sub-packages,
each importing only those listed before it:

- `race/`: a race's state, free of Gradio and HTML: lanes, sessions per pair kind, Pause / Step / Stop.
- `view/`: what the page shows of a race: HTML panes, charts, the cycle view, the page's prose, frames.
- `serve/`: serving visitors: the handlers `ui.py` wires, pairs and loading, request bounds, traces and replays.
"""
