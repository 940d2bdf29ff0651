"""Where a compiled DFlash cycle of the app's lanes goes (`library` GEMMs, static caches of 1,024
positions, 1 thread): torch.profiler over 96 new tokens of the story prompt, the mean time of each
op by input shape for the linears, the attention calls and argmax, and dynamo's per-call work
(docs/benchmarks.md and dev/LOG.md, 2026-12-07). From the repository root:

    python dev/measurements/compiled-lanes-drafter-attention-2026-12-07/profile_dflash_cycle.py
"""
import torch
from torch.profiler import ProfilerActivity, profile

from dflash_core import Target, load_pair, run
from dflash_core.bench.run import BUILTIN_PROMPTS, DEFAULT_DRAFTER
from dflash_core.loading.pair import keep_compiled_code
from dflash_core.loading.prompting import encode_prompt
from dflash_core.precompile import size_caches

SHOWN = ("mkldnn::_linear_pointwise", "dflash_cpu::rows_linear", "dflash_cpu::rows_linear_with",
         "dflash_cpu::masked_attention", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::argmax",
         "TorchDynamo Cache Lookup", "Pregraph bytecode")

torch.set_num_threads(1)
keep_compiled_code()
pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="float32")
target = Target(pair.target.model, pair.tokenizer, static_cache=True, compiled=True, compile_gemms="library")
size_caches(target, pair.drafter, 1020)
ids = encode_prompt(pair.tokenizer, BUILTIN_PROMPTS[-1])
run(target, ids, pair.drafter, max_new_tokens=32)  # compiles, or reads inductor's cache
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    s = run(target, ids, pair.drafter, max_new_tokens=96)
print(f"{len(s.blocks)} cycles")
for e in prof.key_averages(group_by_input_shape=True):
    if e.key in SHOWN:
        print(f"{e.key:52} {e.count:5} calls {e.cpu_time_total / e.count:7.0f} µs  {str(e.input_shapes)[:90]}")
