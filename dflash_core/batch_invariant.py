"""Batch-invariant verification: a block of B tokens computed bitwise as B one-token steps would be.

Speculative decoding is lossless only if verifying a block gives the target's scores exactly as
plain decoding would, one token at a time. Kernels do not promise that: attention over a query
block takes other code paths than a single query (mask, GQA layout, tiling), and in bfloat16 the
rounding differences flip near-tied argmaxes, so outputs drift from plain decoding after a few
dozen tokens. This module removes the difference instead of hoping it is small:

- attention computes each query row of a short block with exactly the call a one-token step makes
  (the same base implementation, the query alone, the keys up to its own position, no mask);
- linear layers use one library for every row count (oneDNN's packed weights, row-invariant).

Everything else in a decoder layer (norms, RoPE, activations, residuals) already works row by row.
By induction over decoding, every cached key and value is then bitwise what plain decoding would
have cached, and DFlash's output equals plain decoding's by construction. That holds in bfloat16
on CPU, where oneDNN's packed kernels are row-invariant (tests/test_batch_invariance.py); its
float32 kernels reduce long rows differently for one row than for a block (a 1536-wide
`down_proj` already differs), so float32 gets no such claim and keeps its fastest one-row library.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .cpu_linear import PackedLinear

SUFFIX = "+rowwise"


def _causal_prefix(mask: torch.Tensor | None, q_len: int, k_len: int) -> bool:
    """Whether `mask` (None, or [b, 1, q, k] bool / additive) lets query i see exactly keys [0, k-q+i]."""
    if mask is None:
        return True
    if mask.dim() != 4 or mask.shape[-2:] != (q_len, k_len):
        return False
    allowed = mask if mask.dtype == torch.bool else mask == 0
    expected = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).tril(k_len - q_len)
    return bool((allowed == expected).all())


def rowwise(base):
    """Wrap attention function `base` so a query block runs as one-query calls of `base`."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        q_len, k_len = query.shape[2], key.shape[2]
        windowed = getattr(module, "sliding_window", None) is not None
        # Plain steps and prefill go through `base` unchanged; so do masks this cannot reproduce
        # (padding, sliding windows), which stay correct but lose the bitwise guarantee.
        if q_len == 1 or q_len == k_len or windowed or not _causal_prefix(attention_mask, q_len, k_len):
            return base(module, query, key, value, attention_mask, **kwargs)
        past = k_len - q_len
        rows = [
            base(module, query[:, :, i : i + 1], key[:, :, : past + i + 1], value[:, :, : past + i + 1], None, **kwargs)[0]
            for i in range(q_len)
        ]
        return torch.cat(rows, dim=1), None

    return attention


def register(base_name: str) -> str:
    """Register the row-wise variant of attention implementation `base_name`; return its name."""
    name = base_name + SUFFIX
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, rowwise(ALL_ATTENTION_FUNCTIONS[base_name]))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base_name])
    return name


def make_batch_invariant(model) -> None:
    """Switch a loaded model to row-wise attention and one linear library for all row counts."""
    current = model.config._attn_implementation
    if not current.endswith(SUFFIX):
        model.set_attn_implementation(register(current))
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.single_row_packed = True


def is_batch_invariant(model) -> bool:
    return model.config._attn_implementation.endswith(SUFFIX)
