"""A race's state, with no Gradio and no HTML: the lanes, their events interleaved on their own
compute clocks, one race session per pair kind (local models, a vLLM server), Pause / Step / Stop,
and the report a finished race gives."""
