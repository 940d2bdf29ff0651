"""What the hover's top-5 lists cost the app's lanes: compiled steps (`library` GEMMs, 1,024
positions, 1 thread), 96 new tokens of the story prompt, plain decoding and DFlash with
`explain=0` and `explain=5` (what the app's lanes ask for), two passes (dev/LOG.md, 2026-12-07).
From the repository root:

    python dev/measurements/compiled-lanes-drafter-attention-2026-12-07/explain_cost.py
"""
import torch

from dflash_core import Target, load_pair, run
from dflash_core.bench.run import BUILTIN_PROMPTS, DEFAULT_DRAFTER
from dflash_core.loading.pair import keep_compiled_code
from dflash_core.loading.prompting import encode_prompt
from dflash_core.precompile import size_caches

torch.set_num_threads(1)
keep_compiled_code()
pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="float32")
target = Target(pair.target.model, pair.tokenizer, static_cache=True, compiled=True, compile_gemms="library")
size_caches(target, pair.drafter, 1020)
ids = encode_prompt(pair.tokenizer, BUILTIN_PROMPTS[-1])
for drafter in (None, pair.drafter):
    run(target, ids, drafter, max_new_tokens=32)  # compiles, or reads inductor's cache
for rep in range(2):
    for drafter in (None, pair.drafter):
        for explain in (0, 5):
            s = run(target, ids, drafter, max_new_tokens=96, explain=explain)
            print(f"pass {rep + 1}, {'DFlash' if drafter else 'plain'}, explain={explain}: "
                  f"{len(s.output_ids) / s.total_s:.1f} tok/s, {1000 * s.total_s / len(s.blocks):.2f} ms a cycle")
