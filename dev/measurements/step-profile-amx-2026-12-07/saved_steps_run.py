"""A prototype of compiled steps saved to disk, run through the engine: `CompiledBackend.capture`
patched to `aot_compile` each step (dynamo's tensor guards kept) and save it under /tmp/saved-steps,
or to load it from there when a file for the step's function and input shapes exists. Runs the
default pair (dtype `auto`, `library` GEMMs, as the app's lanes) on one prompt, 64 new tokens:
plain decoding, DFlash at block 4 and DFlash verifying trees of 4 drafts, each compiled, and prints
each run's seconds (compiling included), whether its output equals plain decoding's, and how many
steps were saved or loaded. Run it twice: the second process loads what the first saved. From the
repository root:

    rm -rf /tmp/saved-steps
    python dev/measurements/step-profile-amx-2026-12-07/saved_steps_run.py    # compiles and saves
    python dev/measurements/step-profile-amx-2026-12-07/saved_steps_run.py    # loads
"""
import collections
import hashlib
import os
import time

import torch

from dflash_core import Target, load_pair, run
from dflash_core.bench.run import DEFAULT_DRAFTER
from dflash_core.loading.pair import keep_compiled_code
from dflash_core.speed import compiled_steps
from dflash_core.speed.kernels import cpu_attention

FOLDER = "/tmp/saved-steps"
os.makedirs(FOLDER, exist_ok=True)
torch.set_num_threads(1)
keep_compiled_code()
counts = collections.Counter()


def tensor_guards(entries):
    return [entry.guard_type in ("TENSOR_MATCH", "SHAPE_ENV") for entry in entries]


def capture(self, step, inputs):
    cpu_attention.prepare()
    owner, function = step.__self__, step.__func__
    options = {"guard_filter_fn": tensor_guards, **({"emulate_precision_casts": True} if self.exact_casts else {})}
    name = repr((function.__qualname__, [(tuple(x.shape), str(x.dtype)) for x in inputs], self.exact_casts,
                 getattr(owner, "feature_layers", None)))
    path = os.path.join(FOLDER, hashlib.sha256(name.encode()).hexdigest()[:24] + ".pt")
    if os.path.exists(path):
        with open(path, "rb") as f:
            compiled = torch.compiler.load_compiled_function(f)
        counts["loaded"] += 1
    else:
        compiled = torch.compile(function, fullgraph=True, dynamic=False, options=options).aot_compile(((owner, *inputs), {}))
        try:
            compiled.save_compiled_function(path)
        except Exception as exc:  # noqa: BLE001 - which steps cannot be saved is what this measures
            print(f"{function.__qualname__} not saved: {type(exc).__name__}: {exc}", flush=True)
            counts["not saved"] += 1
        else:
            counts["saved"] += 1
    return (compiled, owner, inputs), compiled(owner, *inputs)


def replay(self, handle):
    compiled, owner, inputs = handle
    return compiled(owner, *inputs)


compiled_steps.CompiledBackend.capture = capture
compiled_steps.CompiledBackend.replay = replay

pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="auto")
prompt = pair.encode("Write a Python function `is_prime(n)` that returns True when n is a prime number.")
outputs = {}
for label, drafter, extra in (("plain", None, {}), ("dflash", pair.drafter, {"block_size": 4}),
                              ("tree 4", pair.drafter, {"block_size": 4, "tree_budget": 4})):
    target = Target(pair.target.model, pair.target.tokenizer, static_cache=True, compiled=True, compile_gemms="library")
    before = dict(counts)
    start = time.perf_counter()
    summary = run(target, prompt, drafter, max_new_tokens=64, **extra)
    seconds = time.perf_counter() - start
    outputs[label] = summary.output_ids
    same = "" if label == "plain" else f", output equal to plain's: {summary.output_ids == outputs['plain']}"
    print(f"{label}: {seconds:.1f} s{same}; steps {dict(counts - collections.Counter(before))}", flush=True)
