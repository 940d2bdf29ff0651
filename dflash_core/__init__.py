"""DFlash: speculative decoding with a block-diffusion drafter (engine package).

Typical use::

    from dflash_core import load_pair, generate, SamplingParams
    pair = load_pair("path/or/hub-id-of-target", "path/or/hub-id-of-drafter")
    for event in generate(pair.target, prompt_ids, pair.drafter, max_new_tokens=128):
        ...  # Prefill, then one Block per cycle, then Summary
"""

from .decoding import generate, run
from .drafter import DFlashDrafter
from .errors import DFlashError
from .events import Block, Prefill, Summary
from .pair import ModelPair, load_pair, validate_pair
from .sampling import SamplingParams
from .target import Target

__all__ = [
    "Block",
    "DFlashDrafter",
    "DFlashError",
    "ModelPair",
    "Prefill",
    "SamplingParams",
    "Summary",
    "Target",
    "generate",
    "load_pair",
    "run",
    "validate_pair",
]
