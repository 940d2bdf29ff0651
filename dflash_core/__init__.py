"""DFlash: speculative decoding with a block-diffusion drafter (engine package).

Typical use::

    from dflash_core import load_pair, generate, SamplingParams
    pair = load_pair("path/or/hub-id-of-target", "path/or/hub-id-of-drafter")
    for event in generate(pair.target, prompt_ids, pair.drafter, max_new_tokens=128):
        ...  # Prefill, then one Block per cycle, then Summary

The names below are imported on first use, so that importing a light submodule (`events`,
`errors`, the trace validator) does not load torch and transformers: the app's replay mode
serves a recorded run without either.
"""

from importlib import import_module

_EXPORTS = {
    "Block": "events",
    "DFlashDrafter": "models.drafter",
    "DFlashError": "errors",
    "ModelPair": "loading.pair",
    "Prefill": "events",
    "PromptLookup": "prompt_lookup",
    "SamplingParams": "sampling",
    "Summary": "events",
    "Target": "models.target",
    "generate": "decoding",
    "load_pair": "loading.pair",
    "run": "decoding",
    "validate_pair": "loading.pair",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dflash_core' has no attribute {name!r}")
    value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])
