"""Compiled steps: the draft and verify forwards through `torch.compile` (inductor), on any device.

A plain decoding step of a small target on a CPU is mostly weight streaming, plus a Python and
dispatcher cost per module and per small op (RMSNorm, RoPE, SiLU, the cache write) that repeats in
every layer; on a CPU there is no CUDA graph to replay them. Inductor traces a step once per shape
into one function: the elementwise ops fuse into a few C++ loops and the module calls disappear,
while the linears stay library calls (MKL, or the oneDNN-packed ones of `cpu_linear.py`).

`CompiledBackend` is a `cuda_graphs.StepGraphs` backend, so the compiled steps are the graphed
ones and keep their contract: fixed shapes per key, inputs in static buffers, the static caches
written in place (`Target(..., compiled=True)` needs `static_cache=True`), and a capture that fails
leaves its key eager with one `FallbackWarning`. A replay returns the step's fresh outputs, which
stay valid until the next replay of the key, as a graph's do.

Compiling costs time once per shape and process (minutes for a 30-layer model on a loaded 2-core
CPU); inductor keeps the generated code in its on-disk cache (`TORCHINDUCTOR_CACHE_DIR`, by default
under the system's temp folder), so a later process with the same model and shapes starts in seconds.
"""

from __future__ import annotations

import torch
import torch._dynamo

# A run compiles one verify shape per block size (1 to 16 with the block schedule), per target
# wrapper, plus the draft step; past dynamo's default of 8 per function, new shapes would run eagerly.
RECOMPILE_LIMIT = 64
# Dynamo checks its guards before every call, and on a 30-layer model those on the modules' weights
# and attributes took 1.6 ms a step (0.3 ms without them). A target and a drafter are frozen while
# they decode, and what does change between calls (shapes, the Target, its feature layers) is
# still guarded or in the StepGraphs key.
OPTIONS = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}


class CompiledBackend:
    """`capture` compiles the step for its inputs' shapes and runs it; `replay` runs it again."""

    def __init__(self):
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)

    def capture(self, step, inputs):
        compiled = torch.compile(step, fullgraph=True, dynamic=False, options=OPTIONS)
        outputs = compiled(*inputs)
        return (compiled, inputs), outputs

    def replay(self, handle):
        compiled, inputs = handle
        return compiled(*inputs)
