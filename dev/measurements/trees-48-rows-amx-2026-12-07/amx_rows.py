"""Microseconds per call of the rows kernel's `amx` variant over 1 to 49 rows, SmolLM2-135M's MLP
shapes and a 3x wider one, weights cycled through 24 copies so they stream from memory (median of
5), 1 thread; each block checked bitwise against its rows alone. From the repository root:

    python dev/measurements/trees-48-rows-amx-2026-12-07/amx_rows.py
"""
import statistics
import time

import torch

from dflash_core.speed.kernels import cpu_rows

torch.set_num_threads(1)
assert "amx" in cpu_rows.variants(), "this CPU has no AMX tiles"
for out_features, in_features in [(1536, 576), (576, 1536), (4608, 576)]:
    weights = [cpu_rows.pack(torch.randn(out_features, in_features).bfloat16(), "amx") for _ in range(24)]
    cells = []
    for rows in (1, 4, 16, 17, 32, 33, 48, 49):
        x = torch.randn(rows, in_features).bfloat16()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for packed in weights:
                torch.ops.dflash_cpu.rows_linear_amx(x, packed, None)
            times.append((time.perf_counter() - start) / len(weights))
        alone = torch.cat([torch.ops.dflash_cpu.rows_linear_amx(x[i : i + 1], weights[0], None) for i in range(rows)])
        assert torch.equal(torch.ops.dflash_cpu.rows_linear_amx(x, weights[0], None), alone), rows
        cells.append(f"{rows}: {statistics.median(times) * 1e6:.0f}")
    print(f"{out_features}x{in_features} us by rows  " + "  ".join(cells), flush=True)
