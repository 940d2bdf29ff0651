"""`argmax` against `max(dim=-1).indices` on CPU: microseconds per call over 1 to 9 rows of SmolLM2's
49,152-token vocabulary in bfloat16 and float32 (1 thread, 200 calls), then 3,000 tie-heavy random
cases (bf16, fp16, fp32; rounded scores, rows all zero, forced tied maxima) where both must give the
same ids. From the repository root:

    python dev/measurements/greedy-ids-amx-2026-12-07/argmax_or_max.py
"""
import time

import torch

torch.set_num_threads(1)
for dtype in (torch.bfloat16, torch.float32):
    for rows in (1, 4, 9):
        x = torch.randn(rows, 49152).to(dtype)
        cells = []
        for name, call in (("argmax", lambda: x.argmax(-1)), ("max", lambda: x.max(-1).indices)):
            call()
            start = time.perf_counter()
            for _ in range(200):
                call()
            cells.append(f"{name} {(time.perf_counter() - start) / 200 * 1e6:.0f} us")
        print(f"{str(dtype).removeprefix('torch.')} {rows} rows: " + ", ".join(cells))
gen = torch.Generator().manual_seed(0)
mismatches = 0
for trial in range(3000):
    rows, vocab = int(torch.randint(1, 12, (), generator=gen)), (49152, 151936, 1000, 37)[trial % 4]
    dtype = (torch.bfloat16, torch.float32, torch.float16)[trial % 3]
    x = torch.zeros(rows, vocab, dtype=dtype) if trial % 5 == 0 else (torch.randn(rows, vocab, generator=gen) * 3).round().to(dtype)
    if trial % 7 == 0:
        x[:, torch.randint(0, vocab, (5,), generator=gen)] = x.max() + 1
    mismatches += not torch.equal(x.argmax(-1), x.max(-1).indices)
print(f"3000 tie-heavy cases: {mismatches} with different ids")
