"""The compiled steps' attention on CPU: `cpu_attention.cpp`, built with the rows kernel.

A compiled step attends over its whole static cache, whose capacity is fixed when it compiles;
PyTorch's SDPA pays for every masked slot of it. That holds for the target's steps (float32) and
the drafter's (bfloat16, over its own static cache). `masked_attention` reads the mask and computes the
allowed keys only, each output row alone and in one order (so a verify's rows are bitwise its
one-token steps'). `prepare()` builds it (outside tracing: `CompiledBackend.capture` calls it), and
`takes` says, while torch.compile traces a step, whether the kernel takes that attention call;
eager steps keep SDPA, which over a dynamic cache already sees only the positions in use.
"""

from __future__ import annotations

import torch

from . import cpu_rows

# Set by prepare(); read while dynamo traces, which guards on it.
READY = False
DTYPES = (torch.float32, torch.bfloat16)
# Attention options the kernel does not compute: calls that pass any of them take another path.
UNHANDLED = ("softcap", "position_bias", "s_aux", "sinks")


def prepare() -> bool:
    """Build (or load) the kernel where it can run; return whether compiled steps will take it."""
    global READY
    READY = cpu_rows.available()
    return READY


def row_invariant_ready() -> bool:
    """Whether eager batch-invariant steps can take the kernel (it builds and runs here)."""
    return cpu_rows.available()


def takes_mask(mask: torch.Tensor | None, q_len: int) -> bool:
    """Whether `mask` is one the kernel applies to `q_len` query rows: one boolean mask for every
    head of one sequence, a row per query or one row for all."""
    return (mask is not None and mask.dtype == torch.bool and mask.dim() >= 2 and mask.shape[:-2].numel() == 1
            and mask.shape[-2] in (1, q_len))


def takes(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, dropout: float) -> bool:
    """Whether `masked_attention` computes this call: a traced CPU step (float32, or bfloat16 as the
    drafter's) of one sequence with a mask `takes_mask` accepts, head size a multiple of 8, no
    dropout."""
    return (READY and torch.compiler.is_compiling() and takes_mask(mask, query.shape[2])
            and query.device.type == "cpu" and query.dtype == key.dtype and query.dtype in DTYPES
            and query.shape[0] == 1 and query.shape[-1] % 8 == 0 and not dropout)


def masked_attention(query, key, value, mask, scale: float) -> torch.Tensor:
    """softmax(query key^T * scale over the keys `mask` allows) value: query [1, H, L, D], key and
    value [1, Hkv, P, D], mask [L, P] or [1, P] (one row for all queries), with any leading ones
    -> [1, H, L, D]."""
    return torch.ops.dflash_cpu.masked_attention(query, key, value, mask, scale)
