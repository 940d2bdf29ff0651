"""`aot_guarded_step.py` keeping every guard the file can hold, so that it would also check the
Python values the trace read (each linear's path and row bound, the taps, config numbers): dropped
are only the guard types that cannot be saved (closure, module, class, builtin and id matches, and
guards on types defined in a local scope). `save` compiles and saves /tmp/aot-step-most.pt; `load`
(a fresh process) loads it and times it with its guards checked and off, or prints why it did not
load. From the repository root:

    python dev/measurements/step-profile-amx-2026-12-07/aot_most_guards.py save
    python dev/measurements/step-profile-amx-2026-12-07/aot_most_guards.py load
"""
import collections
import sys
import time

import torch
from one_token_step import ms_per_step, prefilled

from dflash_core import Target

PATH = "/tmp/aot-step-most.pt"
UNSAVABLE = {"CLOSURE_MATCH", "ID_MATCH", "MODULE_MATCH", "CLASS_MATCH", "BUILTIN_MATCH"}
target, ids, positions = prefilled()
dropped = collections.Counter()


def savable(entries):
    keep = []
    for entry in entries:
        drop = (entry.guard_type in UNSAVABLE or bool(UNSAVABLE & set(entry.derived_guard_types or ()))
                or (entry.has_value and "<locals>" in type(entry.value).__qualname__))
        dropped.update([entry.guard_type] if drop else [])
        keep.append(not drop)
    return keep


with torch.inference_mode():
    if sys.argv[1] == "save":
        start = time.perf_counter()
        step = torch.compile(Target._step, fullgraph=True, options={"guard_filter_fn": savable})
        step.aot_compile(((target, ids, positions), {})).save_compiled_function(PATH)
        print(f"saved in {time.perf_counter() - start:.0f} s; dropped guards by type: {dict(dropped.most_common())}")
    else:
        try:
            with open(PATH, "rb") as f:
                loaded = torch.compiler.load_compiled_function(f)
        except Exception as exc:  # noqa: BLE001 - the point is what it raises
            print(f"load failed: {type(exc).__name__}: {exc}")
            sys.exit()
        for label in ("guards checked", "guards off"):
            if label == "guards off":
                loaded.disable_guard_check()
            print(f"{label}: {ms_per_step(loaded, target, ids, positions):.1f} ms a step")
