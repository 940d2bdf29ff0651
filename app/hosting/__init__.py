"""Running as a Hugging Face Space: ZeroGPU at run time (`space.py`) and the Space bundle made from
this repository (`bundle.py`, `python -m app.hosting.bundle export DIR`)."""
