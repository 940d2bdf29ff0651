"""DFlash: speculative decoding with a block-diffusion drafter (engine package).

Typical use::

    from dflash_core import load_pair, generate, SamplingParams
    pair = load_pair("path/or/hub-id-of-target", "path/or/hub-id-of-drafter")
    for event in generate(pair.target, prompt_ids, pair.drafter, max_new_tokens=128):
        ...  # Prefill, then one Block per cycle, then Summary

The names below are imported on first use, so that importing a light submodule (`events`,
`errors`, the trace validator) does not load torch and transformers: the app's replay mode
serves a recorded run without either. `dflash_core.loading` exports what loading a pair takes
the same way.
"""

import sys
from importlib import import_module

_EXPORTS = {
    "Block": "events",
    "DFlashDrafter": "models.drafter",
    "DEFAULT_NGRAM_SIZES": "ngram",
    "DFlashError": "errors",
    "ModelPair": "loading.pair",
    "Prefill": "events",
    "PromptLookup": "prompt_lookup",
    "SEQUENTIAL_DRAFTS": "decoding",
    "SamplingParams": "sampling",
    "Summary": "events",
    "Target": "models.target",
    "check_block_size": "decoding",
    "check_schedule": "decoding",
    "compile_draft": "precompile",
    "compile_schedule": "precompile",
    "compile_verify": "precompile",
    "find_match": "ngram",
    "generate": "decoding",
    "load_pair": "loading.pair",
    "method_name": "models.drafter",
    "resolve_model_dir": "models.hub",
    "run": "decoding",
    "size_caches": "precompile",
    "tree_refusal": "decoding",
    "validate_pair": "loading.pair",
}

__all__ = sorted(_EXPORTS)


def lazy_exports(package: str, exports: dict[str, str]):
    """A package's `__getattr__` and `__dir__` that import each name of `exports` (name: the module,
    relative to `package`, that defines it) on first use."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f".{exports[name]}", package), name)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__():
        return sorted([*vars(sys.modules[package]), *exports])

    return __getattr__, __dir__


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
