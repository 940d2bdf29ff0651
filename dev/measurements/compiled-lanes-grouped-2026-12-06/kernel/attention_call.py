"""One attention call, SDPA against the masked-attention kernel, by static-cache capacity: 9 query heads
on 3 key/value heads of 64, 1 or 4 query rows seeing about 150 keys, 1 thread, µs per call over 1,000
calls (docs/benchmarks.md, "The masked-attention kernel"). Run from the repository root:

    python dev/measurements/compiled-lanes-grouped-2026-12-06/kernel/attention_call.py
"""
import time

import torch
import torch.nn.functional as F

from dflash_core.speed.kernels import cpu_attention

torch.set_num_threads(1)
assert cpu_attention.prepare(), "the CPU kernels did not build here"


def microseconds(call, n=1000):
    for _ in range(20):
        call()
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e6


for capacity in (256, 1024):
    for rows in (1, 4):
        q, k, v = torch.randn(1, 9, rows, 64), torch.randn(1, 3, capacity, 64), torch.randn(1, 3, capacity, 64)
        mask = (torch.arange(capacity)[None] <= (150 + torch.arange(rows))[:, None])[None, None]
        sdpa = microseconds(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
        kernel = microseconds(lambda: cpu_attention.masked_attention(q, k, v, mask, 0.125))
        print(f"{capacity} positions, {rows} rows: SDPA {sdpa:.0f} µs, kernel {kernel:.0f} µs")
