"""Microseconds per call of the masked-attention kernel at SmolLM2-135M's shapes (9 query heads, 3
key/value heads, head size 64, 216 keys, all visible) for 1, 4 and 16 query rows, bf16 and float32,
1 thread, mean of 300 calls after 5 warm-ups. Run at a commit and its parent to compare kernels:

    python dev/measurements/rows-kernel-amx-2026-12-07/attention_time.py
"""

import time

import torch

from dflash_core.speed.kernels import cpu_rows

if __name__ == "__main__":
    assert cpu_rows.available()
    torch.set_num_threads(1)
    for dtype in (torch.bfloat16, torch.float32):
        for rows in (1, 4, 16):
            q = torch.randn(1, 9, rows, 64, dtype=dtype)
            k, v = torch.randn(2, 1, 3, 216, 64, dtype=dtype)
            mask = torch.ones(rows, 216, dtype=torch.bool)
            for _ in range(5):
                torch.ops.dflash_cpu.masked_attention(q, k, v, mask, 0.125)
            t0 = time.perf_counter()
            for _ in range(300):
                torch.ops.dflash_cpu.masked_attention(q, k, v, mask, 0.125)
            print(f"{str(dtype).removeprefix('torch.'):9} rows {rows:2d}: {(time.perf_counter() - t0) / 300 * 1e6:6.1f} us")
