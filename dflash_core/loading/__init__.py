"""Loading a pair and its prompts: the offline default target (`default_target.py`), the memory a
pair needs before any download (`memory_need.py`), the pair loaded and validated (`pair.py`),
prompts through the chat template (`chat_template.py`, `prompting.py`), and a loaded pair written
in transformers' native DFlash format (`export_native.py`)."""
