"""The target's attention on CPU: transformers' SDPA attention with each key/value head read once.

A grouped-query model (SmolLM2-135M: 9 query heads on 3 key/value heads) has transformers' `sdpa`
attention copy each key/value head once per query head of its group (`repeat_kv`) whenever a mask
is passed on a CPU, which every verify step and every step over a static cache passes. Over a
static cache that copies the whole cache, used or not, in every layer of every step (its cost:
docs/benchmarks.md, "Grouped-query attention in the compiled steps"). PyTorch's SDPA takes the
groups itself (`enable_gqa=True`), on the CPU with a mask too, bitwise as the repeated heads give.
A one-token step passes a group's query heads as the rows of one head instead, as transformers
does outside `torch.compile` (transformers 5.25's `pack_gqa`; earlier releases repeat there too).

A compiled float32 step over a static cache goes to the masked-attention kernel instead
(`speed/kernels/cpu_attention.py`), which computes the keys its mask allows and no others, so the
cache's unused capacity costs nothing.

`GROUPED_SDPA` names that attention in transformers' `AttentionInterface`; `Target` switches a
model on `sdpa` to it. Off the CPU, without a mask, or with what this does not handle (softcapping,
position biases, attention sinks), it is transformers' `sdpa` unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from ..speed.kernels import cpu_attention

GROUPED_SDPA = "sdpa_grouped_kv"


def _heads_as_rows(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[b, heads, 1, d] -> [b, heads / groups, groups, d]; a mask shared by all heads stays as it is."""
    if x.shape[1] == 1:
        return x
    return x.reshape(x.shape[0], x.shape[1] // groups, groups, x.shape[-1])


def grouped_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' `sdpa_attention_forward`, with grouped key/value heads passed to SDPA as they
    are, and compiled CPU steps on the masked-attention kernel."""
    unhandled = any(kwargs.get(name) is not None for name in cpu_attention.UNHANDLED)
    length = query.shape[2]
    if not unhandled and cpu_attention.takes(query, key, attention_mask, dropout):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        output = cpu_attention.masked_attention(query, key, value, attention_mask, scale)
    elif (getattr(module, "num_key_value_groups", 1) == 1 or attention_mask is None or query.device.type != "cpu"
            or unhandled):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    elif length == 1:  # a group's query heads as the rows of one head, as transformers does outside torch.compile
        groups = module.num_key_value_groups
        output = F.scaled_dot_product_attention(_heads_as_rows(query, groups), key, value,
                                                attn_mask=_heads_as_rows(attention_mask, groups), dropout_p=dropout,
                                                scale=scaling)
    else:
        output = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                                scale=scaling, enable_gqa=True)
    return output.reshape(output.shape[0], -1, length, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
AttentionMaskInterface.register(GROUPED_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
