"""Serving the page to visitors: the handlers `app/ui.py` wires (pair selection and loading, the
live race, replay, Pause / Step, the acceptance doctor, the serving sweep) and the messages a
failure gives."""
