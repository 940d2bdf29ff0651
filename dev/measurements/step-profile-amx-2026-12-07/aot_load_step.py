"""Load the one-token step `aot_compile_step.py` saved (/tmp/aot-step.pt) in a fresh process, as a
second launch would: seconds to load, the first call, its logits against the same step compiled
anew by `torch.compile` with the same options, and its mean time over 20 steps. From the
repository root, after `aot_compile_step.py`:

    python dev/measurements/step-profile-amx-2026-12-07/aot_load_step.py
"""
import time

import torch
from one_token_step import prefilled

from dflash_core import Target

target, ids, positions = prefilled()


def inputs_only(entries):
    return [entry.name.startswith(("L['ids']", "L['positions']")) for entry in entries]


start = time.perf_counter()
with open("/tmp/aot-step.pt", "rb") as f:
    loaded = torch.compiler.load_compiled_function(f)
print(f"loaded in {time.perf_counter() - start:.1f} s")
with torch.inference_mode():
    start = time.perf_counter()
    with target.kv.forward(1):
        out = loaded(target, ids, positions)[0].clone()
    print(f"first call {time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    fresh = torch.compile(Target._step, fullgraph=True, options={"guard_filter_fn": inputs_only})
    with target.kv.forward(1):
        ref = fresh(target, ids, positions)[0]
    print(f"compiled anew in {time.perf_counter() - start:.1f} s; logits bitwise equal: {torch.equal(out, ref)}")
    start = time.perf_counter()
    for _ in range(20):
        with target.kv.forward(1):
            loaded(target, ids, positions)
    print(f"loaded step {(time.perf_counter() - start) / 20 * 1e3:.1f} ms")
