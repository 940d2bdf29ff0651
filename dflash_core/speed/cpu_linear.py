"""Linear layers with weights prepacked for oneDNN: fast few-row matmuls for frozen models on CPU.

Speculative decoding on a CPU lives on two matmul shapes: one row per plain decoding step and a
block of rows per verification. PyTorch sends both to MKL; oneDNN with each weight reordered once
into its blocked layout streams the weights at the same speed for 1 to 16 rows, which on some CPUs
MKL does not (docs/benchmarks.md, "Figures behind code choices").

The packed copy is a cache next to the original weight, which stays a normal parameter (the
drafter borrows the target's LM head, training initialises drafter layers from the target). A
weight changed in place (an optimizer step) or replaced is repacked before its next use, so a
packed module never computes with stale weights. Calls that need gradients take `F.linear`.

Which library is faster for the single row of a plain decoding step depends on the CPU, while
blocks of rows are as fast or faster packed. So `auto` (the default of `DFLASH_CPU_LINEAR`) times
both libraries once over a freshly packed model's single-row calls and keeps the faster; `on`
always runs packed; `off` keeps every layer as it was.

Faster than both on the CPUs measured, where it builds, is this project's rows kernel
(`kernels/cpu_rows.py`: 1 to 16 rows, a batch-invariant model's trees more, each row bitwise as it
would be alone; float32 on AVX2, float32 and bfloat16 on AVX-512, bfloat16 on AMX tiles, the variant
picked by the CPU's features).
Its `amx` variant reads a copy of the weight in the tiles' layout, kept beside the oneDNN one (which
prefills still take): one more copy of each such weight.
`DFLASH_CPU_ROWS` picks: `auto` (the default) times each of the kernel's variants that runs here
against the libraries' choice over one-row and four-row calls (a plain step and a verify) and
keeps the fastest variant unless the libraries are faster;
`on` takes it for every few-row call it can; `off` never.

Models whose weights fit in a cache (under 64 MB) are not timed: there the comparison would not
show the bandwidth-bound case. They run packed, and take the rows kernel where it builds.

Under `torch.compile` (`compiled_steps.py`) a packed layer is the custom op `dflash::packed_linear`:
the compiler cannot trace oneDNN's opaque packed tensor, so the op takes the ordinary weight and
finds its packed copy at run time. Inside `traced_as_linear()` it is a plain `F.linear` instead, for
compiled steps that freeze the weights and pack them with inductor's own GEMMs.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import cpu_rows

MODES = ("auto", "on", "off")


def packable_dtypes() -> tuple[torch.dtype, ...]:
    # Without native bf16 (AVX512-BF16/AMX) oneDNN would emulate it; MKL's path is then no worse.
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


def _mode(variable: str = "DFLASH_CPU_LINEAR") -> str:
    value = os.environ.get(variable, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{variable} must be auto, on or off, not {value!r}")
    return value


def packing_wanted() -> bool:
    return _mode() != "off" and torch.backends.mkldnn.is_available()


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


class PackedLinear(nn.Linear):
    """An `nn.Linear` whose inference forward runs on a oneDNN-packed copy of its weight."""

    packed: torch.Tensor
    packed_key: tuple[int, int]  # which weight storage, at which in-place version, was packed
    single_row_packed: bool = True  # False: one-row inputs take F.linear (see choose_single_row_path)
    rows_kernel: bool = False  # True: inputs of up to `rows_limit` rows take the rows kernel
    rows_limit: int = cpu_rows.MAX_ROWS  # a batch-invariant model raises it to its longest block
    rows_variant: str | None = None  # the kernel's variant (None: the one cpu_rows.rows_linear takes)
    rows_packed: torch.Tensor | None = None  # the weight as the variant reads it, if not the weight itself

    @classmethod
    def convert(cls, linear: nn.Linear) -> "PackedLinear":
        """Turn `linear` into a PackedLinear in place, keeping its parameters (and any weight tying)."""
        linear.__class__ = cls
        linear.repack()
        return linear

    def _weight_key(self) -> tuple[int, int]:
        return self.weight.data_ptr(), self.weight._version

    def repack(self) -> None:
        self.packed = _pack(self.weight)
        self.packed_key = self._weight_key()
        _BY_WEIGHT[self.packed_key[0]] = self
        if self.rows_packed is not None:
            self.rows_packed = cpu_rows.pack(self.weight, self.rows_variant)

    def use_rows_kernel(self, variant: str | None) -> None:
        """Send few-row inputs to the rows kernel's `variant` (or, for a weight that variant does
        not take, to the best one here that does); None: keep them off the kernel."""
        self.rows_kernel = variant is not None
        self.rows_variant, self.rows_packed = cpu_rows.prepare(self.weight, variant) if variant else (None, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if needs_grad or x.device.type != "cpu" or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        compiling = torch.compiler.is_compiling()
        if compiling and _TRACED_AS_LINEAR:
            return F.linear(x, self.weight, self.bias)
        if self.rows_kernel and x.numel() <= self.rows_limit * x.shape[-1]:
            if self.rows_packed is not None and not compiling and self._weight_key() != self.packed_key:
                self.repack()
            return cpu_rows.rows_linear(x, self.weight, self.bias, variant=self.rows_variant, packed=self.rows_packed)
        if not self.single_row_packed and x.numel() == x.shape[-1]:
            return F.linear(x, self.weight, self.bias)
        return packed_linear(x, self.weight, self.bias) if compiling else self.packed_forward(x)

    def packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._weight_key() != self.packed_key:
            self.repack()  # changed in place (optimizer step) or replaced (`.to(dtype)`, `.data =`)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


# Read while torch.compile traces a forward, so dynamo guards on it: whoever compiles inside
# `traced_as_linear()` must also run the compiled function inside it.
_TRACED_AS_LINEAR = False


@contextlib.contextmanager
def traced_as_linear(enabled: bool = True):
    """Within, a packed layer traced by torch.compile is `F.linear` on its ordinary weight (which
    inductor's freezing passes can merge and pack), not the opaque `dflash::packed_linear` op."""
    global _TRACED_AS_LINEAR
    previous, _TRACED_AS_LINEAR = _TRACED_AS_LINEAR, enabled
    try:
        yield
    finally:
        _TRACED_AS_LINEAR = previous


# The packed layer of each weight storage, for the compiled op below.
_BY_WEIGHT: weakref.WeakValueDictionary[int, PackedLinear] = weakref.WeakValueDictionary()


@torch.library.custom_op("dflash::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` through the packed copy of `weight` (F.linear itself if none is known)."""
    module = _BY_WEIGHT.get(weight.data_ptr())
    if module is None or module.weight.shape != weight.shape:
        return F.linear(x, weight, bias)
    return module.packed_forward(x)


@packed_linear.register_fake
def _(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


CALIBRATE_MIN_BYTES = 64 * 2**20


def _median_times(layers: list[PackedLinear], paths: dict, rows: tuple[int, ...], reps: int) -> dict:
    """{path name: median seconds of one sweep through all `layers` with inputs of each row count},
    the paths interleaved so that a machine slowing down hurts them alike."""
    inputs = [[torch.randn(n, m.in_features, dtype=m.weight.dtype) for n in rows] for m in layers]

    def sweep(path) -> float:
        t0 = time.perf_counter()
        for m, xs in zip(layers, inputs):
            for x in xs:
                path(m, x)
        return time.perf_counter() - t0

    times = {name: [] for name in paths}
    for i in range(reps + 1):
        for name, path in paths.items():
            seconds = sweep(path)
            if i:  # the first sweep of each only warms up
                times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}


@torch.inference_mode()
def choose_single_row_path(layers: list[PackedLinear], reps: int = 7) -> bool:
    """Time one-row calls through all of `layers`, packed and with F.linear; set and return whether
    packed stays (MKL must win by 5% to take over, so a tie keeps one library for every row count)."""
    times = _median_times(layers, {
        "packed": lambda m, x: m.packed_forward(x),
        "mkl": lambda m, x: F.linear(x, m.weight, m.bias),
    }, rows=(1,), reps=reps)
    keep = times["mkl"] > 0.95 * times["packed"]
    for m in layers:
        m.single_row_packed = keep
    return keep


@torch.inference_mode()
def choose_rows_kernel(layers: list[PackedLinear], reps: int = 7) -> bool:
    """Time one-row plus four-row calls through all of `layers` (of one dtype) with each variant of
    the rows kernel that takes them and with their current paths; set and return whether the
    kernel takes their few-row calls (the fastest variant, unless slower than the current path)."""
    for m in layers:
        m.use_rows_kernel(None)
    variants = cpu_rows.variants_for(layers[0].weight.dtype)

    def through(variant):
        prepared = {m: cpu_rows.prepare(m.weight, variant) for m in layers}
        return lambda m, x: cpu_rows.rows_linear(x, m.weight, m.bias, *prepared[m])

    times = _median_times(layers, {**{variant: through(variant) for variant in variants},
                                   "current": lambda m, x: m.forward(x)}, rows=(1, 4), reps=reps)
    fastest = min(variants, key=times.__getitem__)
    keep = times[fastest] <= times["current"]
    for m in layers:
        m.use_rows_kernel(fastest if keep else None)
    return keep


def single_row_library(model: nn.Module) -> str | None:
    """'rows kernel', 'oneDNN' or 'MKL': what a packed `model` uses for one-row inputs (None: nothing packed)."""
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    if not layers:
        return None
    if all(m.rows_kernel for m in layers):
        return "rows kernel"
    return "oneDNN" if all(m.single_row_packed for m in layers) else "MKL"


def pack_linears(model: nn.Module, calibrate: bool = True) -> int:
    """Pack every CPU float32/bfloat16 `nn.Linear` in `model`; return how many were packed.

    With `calibrate`, a model of at least CALIBRATE_MIN_BYTES then has its one-row path chosen by
    `choose_single_row_path` and its few-row path by `choose_rows_kernel` (where the variables are
    `auto`); other models take the rows kernel where it builds. Does nothing (returns 0) when
    `DFLASH_CPU_LINEAR=off` or PyTorch was built without oneDNN.
    """
    if not packing_wanted():
        return 0
    dtypes = packable_dtypes()
    packed = []
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.device.type == "cpu" and module.weight.dtype in dtypes:
            packed.append(PackedLinear.convert(module))
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in packed)
    large = calibrate and weight_bytes >= CALIBRATE_MIN_BYTES
    if large and _mode() == "auto":
        choose_single_row_path(packed)
    kernel, rows_mode = [m for m in packed if cpu_rows.eligible(m.weight)], _mode("DFLASH_CPU_ROWS")
    if kernel and rows_mode != "off" and cpu_rows.available():
        if large and rows_mode == "auto":
            for dtype in {m.weight.dtype for m in kernel}:
                choose_rows_kernel([m for m in kernel if m.weight.dtype == dtype])
        else:
            for m in kernel:
                m.use_rows_kernel(cpu_rows.best_for(m.weight))
    return len(packed)
