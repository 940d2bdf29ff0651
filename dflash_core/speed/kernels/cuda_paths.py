"""CUDA-only fast paths: flash-attn for the drafter's attention, CUDA-graph capture of a benchmark step.

Not yet run on a GPU. Nothing here runs on CPU tensors (the guards fall back to PyTorch SDPA or
refuse), so CPU results, the golden traces included, cannot change through it; scripts/gpu_check.py
exercises it on a GPU.

- `drafter_attention`: the drafter's block queries attend, without a causal mask, to all cached
  context plus the whole block. On CUDA, in fp16/bf16, with no explicit mask (no training block
  mask, no sliding window) and flash-attn passing a test call (`fallbacks.py`), that is `flash_attn_func(causal=False)`,
  which handles grouped-query attention natively and reads the cache buffers in place; anything
  else goes to `F.scaled_dot_product_attention` with exactly the arguments the drafter used before.
- `capture_graph`: records a step whose shapes AND cache offsets are fixed (the synthetic
  benchmark's steady-state draft step, which crops the drafter cache back before every replay)
  and returns a replay function. Decoding uses `cuda_graphs.py` instead, whose steps take their
  offsets as device tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cuda_graphs import CudaGraphBackend
from ..fallbacks import HALF_DTYPES, drafter_flash_attn


def drafter_attention(q, k, v, scale: float, attn_mask=None, enable_gqa: bool = False) -> torch.Tensor:
    """Non-causal attention, q [b, heads, q, d], k/v [b, kv_heads, keys, d] -> [b, heads, q, d]."""
    if attn_mask is None and q.is_cuda and q.dtype in HALF_DTYPES:
        flash = drafter_flash_attn(q.device, q.dtype)  # probed once; None (with a notice) if it fails
        if flash is not None:
            # flash-attn takes [b, seq, heads, d]; the transposes are views (unit stride on d kept).
            out = flash(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, causal=False)
            return out.transpose(1, 2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale, enable_gqa=enable_gqa)


def capture_graph(step, warmup: int = 3):
    """CUDA-graph `step()` (no arguments; reads and writes only persistent tensors); returns `replay()`.

    `replay()` reruns the recorded kernels on whatever the persistent input tensors now hold and
    returns the tensors `step` returned during capture (overwritten in place by each replay).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA graphs need a CUDA device")
    backend = CudaGraphBackend(warmup)
    graph, outputs = backend.capture(step, ())

    def replay():
        backend.replay(graph)
        return outputs

    return replay
