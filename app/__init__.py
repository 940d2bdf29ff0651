"""DFlash Studio web app: a live race of DFlash speculative decoding against plain decoding.

The app only renders the events the engine (`dflash_core`) yields; it holds no decoding logic.
`python app.py` launches it; `app.ui.build_demo` builds the Gradio Blocks.
"""
