"""The compiled draft step's attention, the masked-attention kernel against SDPA, in one process:
DFlash through compiled steps (`library` GEMMs, static caches of 1,024 positions as the app's lanes
hold) of 4 natural prompts, 128 new tokens, block 4, 1 thread, with the drafter's bfloat16
attention on the kernel or on SDPA (the target's on the kernel both times), alternating twice.
Dynamo is reset before each, so each recompiles (from inductor's cache after the first time).
Prints tok/s, the median draft and verify ms per cycle, and whether every output matched plain
decoding (docs/benchmarks.md, "The drafter's attention on the kernel"). From the repository root:

    python dev/measurements/compiled-lanes-drafter-attention-2026-12-07/drafter_attention_ab.py
"""
import statistics
import time

import torch
import torch._dynamo

from dflash_core import Target, load_pair, run
from dflash_core.bench.run import DEFAULT_DRAFTER, select_prompts
from dflash_core.loading.pair import keep_compiled_code
from dflash_core.loading.prompting import encode_prompt
from dflash_core.precompile import size_caches
from dflash_core.speed.kernels import cpu_attention

torch.set_num_threads(1)
keep_compiled_code()
pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="float32")
prompts = [encode_prompt(pair.tokenizer, p["prompt"]) for p in select_prompts(None, "natural", 4)]
stop = [pair.tokenizer.eos_token_id]
plain = [run(pair.target, ids, max_new_tokens=128, stop_ids=stop).output_ids for ids in prompts]
takes = cpu_attention.takes


def float32_only(query, key, mask, dropout):
    return query.dtype == torch.float32 and takes(query, key, mask, dropout)


for rep in range(2):
    for variant in ("kernel", "sdpa"):
        cpu_attention.takes = takes if variant == "kernel" else float32_only
        torch._dynamo.reset()
        target = Target(pair.target.model, pair.tokenizer, static_cache=True, compiled=True, compile_gemms="library")
        size_caches(target, pair.drafter, 1020)
        start = time.perf_counter()
        run(target, prompts[0][:8], pair.drafter, max_new_tokens=128, stop_ids=stop)
        warm = time.perf_counter() - start
        tokens, seconds, draft, verify, same = 0, 0.0, [], [], True
        for ids, expected in zip(prompts, plain):
            s = run(target, ids, pair.drafter, max_new_tokens=128, stop_ids=stop)
            tokens, seconds = tokens + len(s.output_ids), seconds + s.total_s
            draft += [b.draft_s for b in s.blocks]
            verify += [b.verify_s for b in s.blocks]
            same &= s.output_ids == expected
        print(f"pass {rep + 1}, drafter attention on {variant:6}: {tokens / seconds:5.1f} tok/s, draft "
              f"{1000 * statistics.median(draft):.2f} ms, verify {1000 * statistics.median(verify):.2f} ms per cycle "
              f"(medians); identical to plain decoding: {same}; warm-up {warm:.0f} s", flush=True)
cpu_attention.takes = takes
