"""The app's compiled lanes with every step traced for its own shape (`static`, as before) or steps of
2 tokens and up traced once with the length symbolic (`dynamic`, `compiled_steps.py` now): compile
the app's plan of 9 steps (`app/pairs/compiled.py`; inductor's cache warm, a second launch's case),
then plain decoding and DFlash on the plain and DFlash lanes' targets over 4 natural prompts, 128 new
tokens, 2 passes, 1 thread. Prints the compile time, then {lane: (tok/s, median verify ms)}
(docs/benchmarks.md, "One trace for every length"). Run each variant in its own process,
alternating; from the repository root:

    for v in static dynamic static dynamic; do
        python dev/measurements/compiled-lanes-drafter-attention-2026-12-07/static_or_dynamic.py $v
    done
"""
import statistics
import sys
import threading
import time

import torch

from app.pairs.compiled import CompiledLanes
from dflash_core import load_pair, run
from dflash_core.bench.run import DEFAULT_DRAFTER, select_prompts
from dflash_core.loading.pair import keep_compiled_code
from dflash_core.loading.prompting import encode_prompt
from dflash_core.speed import compiled_steps

torch.set_num_threads(1)
keep_compiled_code()
if sys.argv[1] == "static":
    compile_as_given = torch.compile

    def static_compile(fn, **options):
        return compile_as_given(fn, **{**options, "dynamic": False})

    compiled_steps.torch.compile = static_compile
pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="float32")
lanes = CompiledLanes(pair.target, pair.drafter)
start = time.perf_counter()
lanes._compile_all(threading.Lock())
print("compiled in", round(time.perf_counter() - start, 1), lanes.status())
prompts = [encode_prompt(pair.tokenizer, p["prompt"]) for p in select_prompts(None, "natural", 4)]
stop = [pair.tokenizer.eos_token_id]
totals = {}
for rep in range(2):
    for ids in prompts:
        for name, target, drafter in (("plain", lanes.targets["plain"], None),
                                      ("dflash", lanes.targets["dflash"], lanes.drafter_of("dflash"))):
            s = run(target, ids, drafter, max_new_tokens=128, stop_ids=stop)
            t = totals.setdefault(name, [0, 0.0, []])
            t[0] += len(s.output_ids)
            t[1] += s.total_s
            t[2] += [b.verify_s for b in s.blocks]
print(sys.argv[1], {k: (round(v[0] / v[1], 2), round(1000 * statistics.median(v[2]), 2)) for k, v in totals.items()},
      flush=True)
