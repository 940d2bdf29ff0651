"""`aot_compile_step.py` keeping dynamo's tensor guards (`TENSOR_MATCH`, and the shape environment's)
on everything but the two inputs: the shapes of the weights and the caches the step reads, so that
a loaded step given other objects fails its guards rather than computing past their buffers. `save`
compiles and saves /tmp/aot-step-guarded.pt and counts the guards by type; `load` (a fresh process)
loads it and calls it as the engine does, inside inference mode: its logits against the eager
step's, its time a step with the guards checked and off, and whether it refuses caches of another
capacity. From the repository root:

    python dev/measurements/step-profile-amx-2026-12-07/aot_guarded_step.py save
    python dev/measurements/step-profile-amx-2026-12-07/aot_guarded_step.py load
"""
import collections
import sys
import time

import torch
from one_token_step import ms_per_step, prefilled

from dflash_core import Target

PATH = "/tmp/aot-step-guarded.pt"
target, ids, positions = prefilled()
kinds = collections.Counter()


def tensor_guards(entries):
    kinds.update(entry.guard_type for entry in entries)
    return [entry.guard_type in ("TENSOR_MATCH", "SHAPE_ENV") and entry.name not in ("ids", "positions")
            for entry in entries]


with torch.inference_mode():
    if sys.argv[1] == "save":
        start = time.perf_counter()
        step = torch.compile(Target._step, fullgraph=True, options={"guard_filter_fn": tensor_guards})
        step.aot_compile(((target, ids, positions), {})).save_compiled_function(PATH)
        print(f"saved in {time.perf_counter() - start:.0f} s; guards by type: {dict(kinds.most_common())}")
    else:
        with open(PATH, "rb") as f:
            loaded = torch.compiler.load_compiled_function(f)
        with target.kv.forward(1):
            out = loaded(target, ids, positions)[0].clone()
        with target.kv.forward(1):
            ref = target._step(ids, positions)[0]
        print(f"the loaded step ran; logits against the eager step's: max difference {(out - ref).abs().max().item():.3g}")
        for label in ("guards checked", "guards checked", "guards off"):
            if label == "guards off":
                loaded.disable_guard_check()
            print(f"{label}: {ms_per_step(loaded, target, ids, positions):.1f} ms a step")
        target, ids, positions = prefilled(512)  # caches of another capacity: the guards must refuse them
        with open(PATH, "rb") as f:
            loaded = torch.compiler.load_compiled_function(f)
        try:
            with target.kv.forward(1):
                loaded(target, ids, positions)
            print("caches of 512 positions: the loaded step ran")
        except RuntimeError as exc:
            print("caches of 512 positions: refused:", " ".join(str(exc).split())[:200])
