"""Microseconds per call of the rows kernel's `amx` variant over 1 to 49 rows, SmolLM2-135M's MLP
shapes and a 3x wider one, weights cycled through 24 copies, past the core's L2 (median of 5 rounds
over the row counts), 1 thread; each block checked bitwise against its rows alone. From the repository root:

    python dev/measurements/trees-48-rows-amx-2026-12-07/amx_rows.py
"""
import statistics
import time

import torch

from dflash_core.speed.kernels import cpu_rows

torch.set_num_threads(1)
assert "amx" in cpu_rows.variants(), "this CPU has no AMX tiles"
COUNTS = (1, 4, 16, 17, 32, 33, 48, 49)
for out_features, in_features in [(1536, 576), (576, 1536), (4608, 576)]:
    weights = [cpu_rows.pack(torch.randn(out_features, in_features).bfloat16(), "amx") for _ in range(24)]
    inputs = {rows: torch.randn(rows, in_features).bfloat16() for rows in COUNTS}
    for rows, x in inputs.items():
        alone = torch.cat([torch.ops.dflash_cpu.rows_linear_amx(x[i : i + 1], weights[0], None) for i in range(rows)])
        assert torch.equal(torch.ops.dflash_cpu.rows_linear_amx(x, weights[0], None), alone), rows
    # Rounds over every row count, the first untimed: timed one count after another, whichever came
    # first ran up to 1.3x slower (the 1-row cells of amx-rows.txt before this change).
    times = {rows: [] for rows in COUNTS}
    for round_ in range(6):
        for rows, x in inputs.items():
            start = time.perf_counter()
            for packed in weights:
                torch.ops.dflash_cpu.rows_linear_amx(x, packed, None)
            if round_:
                times[rows].append((time.perf_counter() - start) / len(weights))
    cells = [f"{rows}: {statistics.median(t) * 1e6:.0f}" for rows, t in times.items()]
    print(f"{out_features}x{in_features} us by rows  " + "  ".join(cells), flush=True)
