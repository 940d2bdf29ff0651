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
blocks of rows are as fast or faster packed. So `auto` (the default) times both libraries once over a freshly packed model's single-row calls and keeps the faster;
`on` always runs packed; `off` keeps every layer as it was. Models whose weights fit in a cache
(under 64 MB) are not timed: there the comparison would not show the bandwidth-bound case.

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


def packable_dtypes() -> tuple[torch.dtype, ...]:
    # Without native bf16 (AVX512-BF16/AMX) oneDNN would emulate it; MKL's path is then no worse.
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


def _mode() -> str:
    value = os.environ.get("DFLASH_CPU_LINEAR", "auto").strip().lower() or "auto"
    if value not in ("auto", "on", "off"):
        raise ValueError(f"DFLASH_CPU_LINEAR must be auto, on or off, not {value!r}")
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if needs_grad or x.device.type != "cpu" or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        if not self.single_row_packed and x.numel() == x.shape[-1]:
            return F.linear(x, self.weight, self.bias)
        if torch.compiler.is_compiling():
            linear = F.linear if _TRACED_AS_LINEAR else packed_linear
            return linear(x, self.weight, self.bias)
        return self.packed_forward(x)

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


@torch.inference_mode()
def choose_single_row_path(layers: list[PackedLinear], reps: int = 7) -> bool:
    """Time one-row calls through all of `layers`, packed and with F.linear, interleaved so that a
    machine slowing down hurts both alike; set and return whether packed stays (MKL must win by
    5% to take over, so a tie keeps one library for every row count)."""
    rows = [torch.randn(1, m.in_features, dtype=m.weight.dtype) for m in layers]

    def sweep(packed: bool) -> float:
        t0 = time.perf_counter()
        for m, x in zip(layers, rows):
            m.packed_forward(x) if packed else F.linear(x, m.weight, m.bias)
        return time.perf_counter() - t0

    times = {True: [], False: []}
    for i in range(reps + 1):
        for packed in (True, False):
            if i:  # the first sweep of each only warms up
                times[packed].append(sweep(packed))
            else:
                sweep(packed)
    keep = statistics.median(times[False]) > 0.95 * statistics.median(times[True])
    for m in layers:
        m.single_row_packed = keep
    return keep


def single_row_library(model: nn.Module) -> str | None:
    """'oneDNN' or 'MKL': what a packed `model` uses for one-row inputs (None: nothing packed)."""
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    if not layers:
        return None
    return "oneDNN" if all(m.single_row_packed for m in layers) else "MKL"


def pack_linears(model: nn.Module, calibrate: bool = True) -> int:
    """Pack every CPU float32/bfloat16 `nn.Linear` in `model`; return how many were packed.

    Under `auto` and with `calibrate`, a model of at least CALIBRATE_MIN_BYTES then has its one-row
    path chosen by `choose_single_row_path`. Does nothing (returns 0) when `DFLASH_CPU_LINEAR=off`
    or PyTorch was built without oneDNN.
    """
    if not packing_wanted():
        return 0
    dtypes = packable_dtypes()
    packed = []
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.device.type == "cpu" and module.weight.dtype in dtypes:
            packed.append(PackedLinear.convert(module))
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in packed)
    if calibrate and _mode() == "auto" and weight_bytes >= CALIBRATE_MIN_BYTES:
        choose_single_row_path(packed)
    return len(packed)
