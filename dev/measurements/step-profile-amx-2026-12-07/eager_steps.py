"""Eager verify steps of 1, 4 and 9 tokens on the default pair's target (dtype `auto`), 1 thread:
median ms over 11 rounds of 5 steps each after a 100-token prefill (the first round untimed). The
A/B of `alternate-tiles.patch` ran it twice at the checkout and twice with the patch applied
(`git apply`; the kernel rebuilds on the next import). From the repository root:

    python dev/measurements/step-profile-amx-2026-12-07/eager_steps.py
"""
import statistics
import time

import torch

from dflash_core import load_pair
from dflash_core.bench.run import DEFAULT_DRAFTER

torch.set_num_threads(1)
pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="auto")
target = pair.target
prompt = torch.tensor([list(range(100, 200))])
times = {1: [], 4: [], 9: []}
for round_ in range(12):
    target.reset()
    target.forward(prompt)
    for n in times:
        block = torch.tensor([list(range(300, 300 + n))])
        start = time.perf_counter()
        for _ in range(5):
            target.forward(block)
            target.crop(target.kv.length - n)
        if round_:
            times[n].append((time.perf_counter() - start) / 5 * 1e3)
print("  ".join(f"{n} tokens {statistics.median(t):.2f} ms" for n, t in times.items()))
