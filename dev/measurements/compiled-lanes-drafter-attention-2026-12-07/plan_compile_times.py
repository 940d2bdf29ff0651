"""Seconds to compile each step the app's lanes compile (`app/pairs/compiled.py`'s plan, in its
order) on the default pair, 1 thread, with whatever inductor's cache already holds, then dynamo's
and inductor's own timers (`torch._dynamo.utils.compile_times`); docs/benchmarks.md, "One trace for
every length". From the repository root, twice (the second run is a second launch's case); the
target's dtype is float32 unless given (`auto`: what the app loads):

    python dev/measurements/compiled-lanes-drafter-attention-2026-12-07/plan_compile_times.py [auto]
"""
import sys
import time

import torch

from app.pairs.compiled import CompiledLanes
from dflash_core import load_pair
from dflash_core.bench.run import DEFAULT_DRAFTER
from dflash_core.loading.pair import keep_compiled_code

torch.set_num_threads(1)
keep_compiled_code()
pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype=sys.argv[1] if len(sys.argv) > 1 else "float32")
lanes = CompiledLanes(pair.target, pair.drafter)
start = time.perf_counter()
for step in lanes.steps:
    began = time.perf_counter()
    lanes.compile(step)
    print(f"{step.describe()}: {time.perf_counter() - began:.1f} s", flush=True)
print(f"all {len(lanes.steps)} steps: {time.perf_counter() - start:.1f} s")
print(torch._dynamo.utils.compile_times())
