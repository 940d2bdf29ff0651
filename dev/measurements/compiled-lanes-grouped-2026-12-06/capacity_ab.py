# Plain decoding of the story example through compiled steps over static caches of 256, 512 and 1,024
# positions against the eager steps, three interleaved passes, after the grouped-query attention change:
#     python dev/measurements/compiled-lanes-grouped-2026-12-06/capacity_ab.py
import time, torch
torch.set_num_threads(1)
from dflash_core import load_pair, Target, run, size_caches
from dflash_core.loading import keep_compiled_code, encode_prompt
keep_compiled_code()
pair = load_pair("default:smollm2", "assets/drafters/smollm2-135m-instruct-dflash")
ids = encode_prompt(pair.tokenizer, "Write a short story about a robot who learns to paint the sea.")
ts = {}
for cap in (256, 512, 1024):
    t = Target(pair.target.model, pair.tokenizer, static_cache=True, compiled=True, compile_gemms="library")
    size_caches(t, pair.drafter.with_own_cache(), cap - 4)
    run(t, ids, None, max_new_tokens=8)
    ts[cap] = t
ts["eager"] = pair.target
for rep in range(3):
    for name, t in ts.items():
        s = run(t, ids, None, max_new_tokens=96)
        c = time.process_time()
        print(name, t.kv.capacity if name != "eager" else "", f"{len(s.output_ids)/s.total_s:.1f} tok/s", flush=True)
