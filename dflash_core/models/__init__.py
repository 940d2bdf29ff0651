"""The models and their formats: paths and Hub ids (`hub.py`); the target over any transformers
causal LM (`target.py`), its per-layer-kind cache rollback (`target_cache.py`) and its attention on
CPU (`attention.py`); the DFlash drafter (`drafter.py`), DFlash2's additions (`dflash2.py`) and the
drafter config (`config.py`); transformers' native DFlash format (`native_format.py`)."""
