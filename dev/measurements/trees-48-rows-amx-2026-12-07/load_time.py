"""Seconds to load the default pair as the app does (dtype `auto`; on this class a batch-invariant
bf16 target, whose row-invariance probe runs at load), twice in one process, 1 thread. From the
repository root, at the commit to time:

    python dev/measurements/trees-48-rows-amx-2026-12-07/load_time.py
"""
import time

import torch

from dflash_core import load_pair
from dflash_core.bench.run import DEFAULT_DRAFTER
from dflash_core.speed.batch_invariant import describe

torch.set_num_threads(1)
for _ in range(2):
    start = time.perf_counter()
    pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="auto")
    print(f"loaded in {time.perf_counter() - start:.2f} s; {describe(pair.target.model)}")
