"""Compiled steps: the draft and verify forwards through `torch.compile` (inductor), on any device.

A plain decoding step of a small target on a CPU is mostly weight streaming, plus a Python and
dispatcher cost per module and per small op (RMSNorm, RoPE, SiLU, the cache write) that repeats in
every layer; on a CPU there is no CUDA graph to replay them. Inductor traces a step into one
function: the elementwise ops fuse into a few C++ loops and the module calls disappear. A
one-token step is traced for its shape; steps of more tokens (`library` GEMMs) once for every
length, which is then symbolic.

The linears of a CPU step run one of two ways (`gemms`):

- `template` (the default on CPU): inductor freezes the weights into the compiled step as
  constants, merges the linears that read the same input (q/k/v, gate/up) into one weight each,
  packs every weight once for its shape and runs it through the faster, measured at compile time,
  of its own C++ GEMM template and MKL's packed GEMM (figures: docs/benchmarks.md, "Compiled steps").
- `library`: the weights stay parameters and the linears library calls: MKL for one row, the
  oneDNN-packed ones of `cpu_linear.py` for a block.

`template` costs compile time (each new weight shape is timed both ways) and memory (each compiled
shape holds its own packed copy of the weights), and a compiled step keeps computing with the
weights it froze: the models must not change while they decode (the engine's never do; training
runs eagerly). Off the CPU both names mean `library`. `DFLASH_COMPILE_GEMMS` sets the default.

`CompiledBackend` is a `cuda_graphs.StepGraphs` backend, so the compiled steps are the graphed
ones and keep their contract: fixed shapes per key, inputs in static buffers, the static caches
written in place (`Target(..., compiled=True)` needs `static_cache=True`), and a capture that fails
leaves its key eager with one `FallbackWarning`. A replay returns the step's fresh outputs, which
stay valid until the next replay of the key, as a graph's do.

Compiling costs time once per shape and process (minutes for a 30-layer model on a loaded 2-core
CPU); inductor keeps the generated code and its GEMM timings in its on-disk cache
(`TORCHINDUCTOR_CACHE_DIR`; `load_pair(..., compiled=True)` puts it under the project's cache
folder, `loading/pair.keep_compiled_code`), so a later process with the same model and shapes
skips inductor's part, though dynamo still traces every step again. With a `steps_folder`, a
`library` step on a CPU is saved whole instead, and a later process loads it without a trace
(`saved_steps.py`); such a step leaves every size above 1 symbolic from its first trace.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
import torch._dynamo
import torch._inductor.config

from ..errors import ConfigError
from . import saved_steps
from .cpu_linear import traced_as_linear
from .kernels import cpu_attention

# With `template` GEMMs a run compiles one verify shape per block size (1 to 16 with the block
# schedule), per target wrapper, plus the draft step; past dynamo's default of 8 per function, new
# shapes would run eagerly.
RECOMPILE_LIMIT = 64
# Dynamo checks its guards before every call, and on a 30-layer model those on the modules' weights
# and attributes took 1.6 ms a step (0.3 ms without them). A target and a drafter are frozen while
# they decode, and what does change between calls (shapes, the Target, its feature layers) is
# still guarded or in the StepGraphs key.
OPTIONS = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}

GEMMS = ("template", "library")
# Inductor's settings for `template`. Dynamo reads `freezing` while it traces, so besides going
# into the compile's options they are patched into inductor's global config around every compile
# and run of such a step.
TEMPLATE_CONFIG = {
    "freezing": True,
    "cpp.enable_concat_linear": True,
    "max_autotune": True,
    "max_autotune_gemm_backends": "CPP,ATEN",
}


def _checked(gemms: str, source: str) -> str:
    if gemms not in GEMMS:
        raise ConfigError(f"compiled GEMMs must be one of {', '.join(GEMMS)}, not {gemms!r} ({source})")
    return gemms


@contextlib.contextmanager
def _template_settings():
    with torch._inductor.config.patch(TEMPLATE_CONFIG), traced_as_linear():
        yield


class CompiledBackend:
    """`capture` compiles the step for its inputs' shapes and runs it; `replay` runs it again."""

    def __init__(self, gemms: str | None = None, exact_casts: bool = False, steps_folder: str | Path | None = None):
        """exact_casts: round every intermediate to its dtype as eager ops do (inductor's
        `emulate_precision_casts`). A fused kernel otherwise keeps a bf16 op's result in float32 for
        the next op, where that result is not written out, and which results a graph writes out
        depends on the graph: a block's verify step and a one-token step then round differently,
        which a batch-invariant target's steps must not (docs/benchmarks.md). steps_folder: save
        each compiled CPU step of `library` GEMMs there, and load it from there in a later process
        instead of compiling it again (`saved_steps.py`)."""
        self.exact_casts = exact_casts
        if gemms is None:
            variable = os.environ.get("DFLASH_COMPILE_GEMMS", "").strip().lower() or "template"
            gemms = _checked(variable, "DFLASH_COMPILE_GEMMS")
        self.gemms = _checked(gemms, "compile_gemms")
        self.saved = saved_steps.SavedSteps(steps_folder) if steps_folder is not None and saved_steps.available() else None
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)

    def capture(self, step, inputs, tag=None):
        on_cpu = all(x.device.type == "cpu" for x in inputs)
        if on_cpu:
            cpu_attention.prepare()
        # A `template` step holds the frozen weights: its file would carry a copy of them.
        if self.saved is not None and on_cpu and self.gemms == "library":
            options = {"emulate_precision_casts": True} if self.exact_casts else {}
            if (compiled := self.saved.compile(step, inputs, tag, options)) is not None:
                args = (step.__self__, *inputs)
                return (compiled, args, contextlib.nullcontext), compiled(*args)
        if self.gemms == "template" and on_cpu:
            # The config also goes into the options: dynamo reuses a step's code compiled by an
            # equal backend whose guards pass, and a library-compiled step traces the same graph
            # wherever a layer takes F.linear anyway (one-row inputs on MKL, `cpu_linear.py`).
            options, settings = {**OPTIONS, **TEMPLATE_CONFIG}, _template_settings
        else:
            options, settings = OPTIONS, contextlib.nullcontext
        if self.exact_casts:
            options = {**options, "emulate_precision_casts": True}
        # `library` steps trace once per kind of step, not per length: dynamo's automatic dynamic
        # shapes retrace a step whose length changed with that size symbolic (lengths of 2 and up;
        # 1 stays its own), and each later length reuses it, at the same cost per step, since the
        # rows and attention kernels take any number of rows. Each trace of a 30-layer target
        # costs seconds of dynamo's time (docs/benchmarks.md, "Compiled lanes in the app").
        # `template` GEMMs are packed and timed for one shape each.
        dynamic = False if self.gemms == "template" and on_cpu else None
        compiled = torch.compile(step, fullgraph=True, dynamic=dynamic, options=options)
        with settings():
            outputs = compiled(*inputs)
        return (compiled, inputs, settings), outputs

    def replay(self, handle):
        compiled, inputs, settings = handle
        with settings():
            return compiled(*inputs)

