"""Does a saved step, traced with every size above 1 symbolic, run as fast as the step dynamo traces
for its shapes? One process, the default pair (dtype `auto`, 1 thread, `library` GEMMs as the app's
lanes): DFlash at block 4 on one compiled target whose steps are saved (`steps_folder`: the draft and
block-verify steps symbolic) and one that compiles as before (first shapes static), each warmed up,
then 128 new tokens on each in turn for 5 rounds; prints each round's tok/s and whether the output
equals plain decoding's on the same target (compiled and eager bf16 steps round differently,
docs/benchmarks.md, "Compiled bf16 steps"). With a folder as its argument, the saved target keeps
its steps there: run it twice with the same folder and the second run's saved target runs the steps
loaded from the files. From the repository root:

    python dev/measurements/saved-steps-amx-2026-12-07/symbolic_ab.py                   # a fresh folder
    python dev/measurements/saved-steps-amx-2026-12-07/symbolic_ab.py /tmp/ab-steps     # twice: loaded
"""
import sys
import tempfile
import time

import torch

from dflash_core import Target, load_pair, run
from dflash_core.bench.run import DEFAULT_DRAFTER
from dflash_core.loading.pair import keep_compiled_code

torch.set_num_threads(1)
keep_compiled_code()
pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="auto")
prompt = pair.encode("Write a short story about a robot who learns to paint the sea.")
targets = {
    "saved (symbolic)": Target(pair.target.model, pair.target.tokenizer, static_cache=True, compiled=True,
                               compile_gemms="library", steps_folder=sys.argv[1] if sys.argv[1:] else tempfile.mkdtemp()),
    "as before (static)": Target(pair.target.model, pair.target.tokenizer, static_cache=True, compiled=True,
                                 compile_gemms="library"),
}
plain = {name: run(target, prompt, None, max_new_tokens=128).output_ids for name, target in targets.items()}
for target in targets.values():
    run(target, prompt, pair.drafter, max_new_tokens=16, block_size=4)  # compiles
saved = targets["saved (symbolic)"].graphs.backend.saved
print(f"saved target: {saved.loaded} steps loaded, {saved.saved} compiled and saved", flush=True)
for round_ in range(5):
    for name, target in targets.items():
        start = time.perf_counter()
        out = run(target, prompt, pair.drafter, max_new_tokens=128, block_size=4).output_ids
        print(f"round {round_}: {name:20} {128 / (time.perf_counter() - start):.1f} tok/s, equal to plain: {out == plain[name]}",
              flush=True)
