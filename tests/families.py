"""Tiny random targets of every supported model family, built from transformers' config classes.

Each is saved with `save_pretrained` beside the byte-level tokenizer of `tiny.py`, so it loads
through `Target.from_pretrained` as a downloaded checkpoint would. Sizes are the smallest that keep
each family's structure: hybrids keep linear-attention layers before a full-attention one, sliding
layers get a window of 8 (filled after a few cycles), gemma4 keeps per-layer inputs and KV sharing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from tiny import build_tokenizer
from transformers import AutoModelForCausalLM

WINDOW = 8  # sliding-window length: a 20-token prompt already overflows it

COMMON = dict(
    hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
    tie_word_embeddings=False,
)
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)

# family (the config's model_type) -> (config class name, its arguments beyond COMMON)
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(intermediate_size=64, num_hidden_layers=4)),
    "qwen3": ("Qwen3Config", dict(intermediate_size=64, num_hidden_layers=4)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(intermediate_size=64, num_hidden_layers=4, **MOE)),
    # three gated delta-net layers, then full attention (the released 3:1 pattern)
    "qwen3_5": ("Qwen3_5TextConfig", dict(intermediate_size=64, num_hidden_layers=4, **LINEAR)),
    "qwen3_5_moe": (
        "Qwen3_5MoeTextConfig", dict(num_hidden_layers=4, shared_expert_intermediate_size=16, **LINEAR, **MOE)
    ),
    "qwen3_next": (
        "Qwen3NextConfig",
        dict(intermediate_size=64, num_hidden_layers=4, shared_expert_intermediate_size=16, **LINEAR, **MOE),
    ),
    # sliding and full attention alternate; every attention layer has sinks
    "gpt_oss": (
        "GptOssConfig",
        dict(
            intermediate_size=32, num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=WINDOW,
            rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                 truncate=False, original_max_position_embeddings=128),
        ),
    ),
    # sliding/full alternate; the last two layers reuse the KV of the last earlier layer of their type
    "gemma4": (
        "Gemma4TextConfig",
        dict(
            intermediate_size=64, num_hidden_layers=6, sliding_window=WINDOW, layer_types=["sliding_attention",
            "full_attention"] * 3, num_kv_shared_layers=2, hidden_size_per_layer_input=8, global_head_dim=16,
        ),
    ),
}


def config_class(family: str):
    """The family's config class, or a pytest skip naming the transformers release that lacks it."""
    name = FAMILIES[family][0]
    cls = getattr(transformers, name, None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name} ({family})")
    return cls


def build_family_target(
    directory: Path, family: str, *, seed: int = 0, logit_scale: float = 8.0, vocab_size: int | None = None,
    linear_gain: float = 1.0, **overrides,
) -> Path:
    """A random `family` causal LM, saved to `directory` with the tiny tokenizer (none with `vocab_size`).

    linear_gain scales the output projection of gated delta-net layers: their share of the logits.
    """
    tokenizer = build_tokenizer()
    vocab = vocab_size or len(tokenizer)
    extra = {**FAMILIES[family][1], **overrides}
    if family == "gemma4":
        extra["vocab_size_per_layer_input"] = vocab
    config = config_class(family)(
        vocab_size=vocab, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        **{**COMMON, **extra},
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        # Larger logits keep greedy choices far from ties (as in tiny.build_target).
        model.get_output_embeddings().weight.mul_(logit_scale)
        for module in model.modules():
            if type(module).__name__.endswith("GatedDeltaNet"):
                # Random initialisation draws the decay rate A from 0.01..16, so most heads forget
                # within a token or two; A = e^-4 keeps ~0.98 of the state per token, and a rejected
                # draft left in it changes the greedy output (5 of 5 prompts without the rollback).
                module.A_log.fill_(-4.0)
                module.out_proj.weight.mul_(linear_gain)
    model.save_pretrained(directory)
    if vocab_size is None:
        tokenizer.save_pretrained(directory)
    return Path(directory)
