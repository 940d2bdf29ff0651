"""Where a compiled plain step of the app's lanes goes, with the target's attention as transformers'
`sdpa` (each key/value head repeated per query head over the whole static cache) or as the engine's
grouped-query SDPA: eager against compiled (`library` GEMMs, a static cache of 256 positions as the
app's lanes hold) ms per token over 64 plain tokens of the story prompt, three passes interleaved,
then torch.profiler's table of the compiled run.

    python dev/measurements/compiled-lanes-grouped-2026-12-06/profile_compiled_plain.py sdpa
    python dev/measurements/compiled-lanes-grouped-2026-12-06/profile_compiled_plain.py grouped
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from dflash_core import Target, load_pair, run
from dflash_core.bench.run import BUILTIN_PROMPTS
from dflash_core.loading.pair import keep_compiled_code
from dflash_core.loading.prompting import encode_prompt
from dflash_core.precompile import size_caches

torch.set_num_threads(1)
keep_compiled_code()
pair = load_pair("default:smollm2", None, dtype="float32")
eager = pair.target
compiled = Target(eager.model, pair.tokenizer, static_cache=True, compiled=True, compile_gemms="library")
if sys.argv[1] == "sdpa":
    eager.model.set_attn_implementation("sdpa")  # before anything compiles
size_caches(compiled, None, 255)
print("attention", eager.model.config._attn_implementation, "capacity", compiled.kv.capacity)
ids = encode_prompt(pair.tokenizer, BUILTIN_PROMPTS[-1])
reference = run(eager, ids, max_new_tokens=64)
start = time.time()
run(compiled, ids, max_new_tokens=8)
print(f"compiled in {time.time() - start:.1f} s", flush=True)
for name, target in (("eager", eager), ("compiled", compiled)) * 3:
    start = time.perf_counter()
    out = run(target, ids, max_new_tokens=64)
    print(f"{name}: {1000 * (time.perf_counter() - start) / 64:.1f} ms per token, output identical to eager: "
          f"{out.output_ids == reference.output_ids}", flush=True)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    run(compiled, ids, max_new_tokens=64)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
