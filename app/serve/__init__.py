"""Serving the page to visitors: the handlers `app/ui.py` wires (pair loading, the live race, replay,
Pause / Step, the acceptance doctor), the pairs offered and their loading, the bounds on what one
visitor may ask, trace files and replays, failure messages, who is calling, and running as a
Hugging Face Space."""
