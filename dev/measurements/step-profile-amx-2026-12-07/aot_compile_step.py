"""Whether torch's `torch.compile(...).aot_compile` (a compiled function saved to a file, so that a
later process skips dynamo's tracing) takes the default pair's one-token step, `Target._step`
(dtype `auto`, static cache of 1024, eager prefill of 4 tokens), 1 thread: once with the guards
dynamo keeps by default, once keeping only the guards on the two input tensors. Prints what each
try raised. From the repository root:

    python dev/measurements/step-profile-amx-2026-12-07/aot_compile_step.py
"""
import time

import torch
from one_token_step import prefilled

from dflash_core import Target

target, ids, positions = prefilled()


def inputs_only(entries):
    return [entry.name.startswith(("L['ids']", "L['positions']")) for entry in entries]


for label, options in (("default guards", {}), ("input guards only", {"guard_filter_fn": inputs_only})):
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            step = torch.compile(Target._step, fullgraph=True, options=options).aot_compile(((target, ids, positions), {}))
            step.save_compiled_function("/tmp/aot-step.pt")
        print(f"{label}: saved in {time.perf_counter() - start:.0f} s")
    except Exception as exc:  # noqa: BLE001 - the point is what it raises
        print(f"{label}: {type(exc).__name__} after {time.perf_counter() - start:.0f} s: {str(exc).splitlines()[0][:200]}")
