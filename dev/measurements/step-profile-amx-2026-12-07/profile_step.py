"""Where a plain decoding step of the default pair goes, compiled as the app's lanes compile it
(dtype `auto`, `library` GEMMs, static cache of 1024), 1 thread: its mean time over 30 steps after a
100-token prefill, then torch.profiler's table over 10 more. From the repository root:

    python dev/measurements/step-profile-amx-2026-12-07/profile_step.py
"""
import time

import torch

from dflash_core import Target, load_pair
from dflash_core.bench.run import DEFAULT_DRAFTER
from dflash_core.loading.pair import keep_compiled_code
from dflash_core.precompile import compile_verify

torch.set_num_threads(1)
keep_compiled_code()
pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="auto")
target = Target(pair.target.model, pair.target.tokenizer, static_cache=True, compiled=True, compile_gemms="library")
target.reset(1024)
compile_verify(target, 1)
target.forward(torch.tensor([list(range(100, 200))]))
token = torch.tensor([[300]])
for _ in range(5):
    target.forward(token)
start = time.perf_counter()
for _ in range(30):
    target.forward(token)
print(f"compiled plain step: {(time.perf_counter() - start) / 30 * 1e3:.1f} ms")
with torch.profiler.profile() as prof:
    for _ in range(10):
        target.forward(token)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
