"""Loading a pair and its prompts: the offline default target (`default_target.py`), the memory a
pair needs before any download (`memory_need.py`), the pair loaded and validated (`pair.py`),
prompts through the chat template (`chat_template.py`, `prompting.py`), the options every command
shares (`cli.py`), and a loaded pair written in transformers' native DFlash format
(`export_native.py`).

The names below are what loading takes from outside this folder (the app among them), imported on
first use: the chat template's helpers load neither torch nor transformers.
"""

from .. import lazy_exports

_EXPORTS = {
    "MARGIN": "memory_need",
    "PairSize": "memory_need",
    "check_fits": "memory_need",
    "pair_size": "memory_need",
    "DEFAULT_TARGET": "default_target",
    "DefaultTargetError": "default_target",
    "resolve_target": "default_target",
    "smollm2_gguf_path": "default_target",
    "THINKING_CHOICES": "chat_template",
    "describe_template": "chat_template",
    "has_thinking_switch": "chat_template",
    "template_args": "chat_template",
    "encode_prompt": "prompting",
    "ModelPair": "pair",
    "default_drafter_dtype": "pair",
    "fetch_target": "pair",
    "keep_compiled_code": "pair",
    "compiled_steps_folder": "pair",
    "load_drafter": "pair",
    "load_lane_drafter": "pair",
    "load_pair": "pair",
    "parse_dtype": "pair",
    "cuda_mismatch": ".speed.device",  # dflash_core.speed.device: a leading dot steps out of loading/
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
