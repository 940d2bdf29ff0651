"""DFlash Studio web app: a live race of DFlash speculative decoding against plain decoding.

The app only renders the events the engine (`dflash_core`) yields; it holds no decoding logic.
`python app.py` launches it; `app.ui.build_demo` builds the Gradio Blocks. Six sub-packages,
each importing only those listed before it:

- `race/`: a race's state, free of Gradio and HTML: lanes, sessions per pair kind, Pause / Step / Stop.
- `view/`: what the page shows of a race: HTML panes, charts, the cycle view, the page's prose, frames.
- `guard/`: what one visitor may ask: the HTTP guard, queue bounds, request bounds, callers, trace files.
- `pairs/`: the pairs offered (`pairs.json`) and the loaded pairs, kept once each.
- `hosting/`: running as a Hugging Face Space (ZeroGPU) and the Space bundle.
- `serve/`: the handlers `ui.py` wires: pair loading, the race, replay, Pause / Step, the doctor.
"""
