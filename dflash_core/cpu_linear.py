"""Linear layers with weights prepacked for oneDNN: fast few-row matmuls for frozen models on CPU.

Speculative decoding on a CPU lives on two matmul shapes: one row per plain decoding step and a
block of rows per verification. PyTorch sends both to MKL, which on this project's CI machine
(2-core AMD EPYC) streams the weights at about a third of the memory bandwidth for one row and is
slower still for eight; oneDNN with each weight reordered once into its blocked layout streams
them at the same speed for 1 to 16 rows. Measured on SmolLM2-135M in float32 at context 200: a
plain step 57 -> 41 ms, a verification of 8 tokens 83 -> 47 ms (docs/benchmarks.md).

The packed copy is a cache next to the original weight, which stays a normal parameter (the
drafter borrows the target's LM head, training initialises drafter layers from the target). A
weight changed in place (an optimizer step) or replaced is repacked before its next use, so a
packed module never computes with stale weights. Calls that need gradients take `F.linear`.

`DFLASH_CPU_LINEAR=off` keeps every layer as it was; `on`/`auto` (default) pack on CPU.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn


def packable_dtypes() -> tuple[torch.dtype, ...]:
    # Without native bf16 (AVX512-BF16/AMX) oneDNN would emulate it; MKL's path is then no worse.
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


def packing_wanted() -> bool:
    value = os.environ.get("DFLASH_CPU_LINEAR", "auto").strip().lower() or "auto"
    if value not in ("auto", "on", "off"):
        raise ValueError(f"DFLASH_CPU_LINEAR must be auto, on or off, not {value!r}")
    return value != "off" and torch.backends.mkldnn.is_available()


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


class PackedLinear(nn.Linear):
    """An `nn.Linear` whose inference forward runs on a oneDNN-packed copy of its weight."""

    packed: torch.Tensor
    packed_key: tuple[int, int]  # which weight storage, at which in-place version, was packed

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if needs_grad or x.device.type != "cpu" or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        if self._weight_key() != self.packed_key:
            self.repack()  # changed in place (optimizer step) or replaced (`.to(dtype)`, `.data =`)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(model: nn.Module) -> int:
    """Pack every CPU float32/bfloat16 `nn.Linear` in `model`; return how many were packed.

    Does nothing (returns 0) when `DFLASH_CPU_LINEAR=off` or PyTorch was built without oneDNN.
    """
    if not packing_wanted():
        return 0
    dtypes = packable_dtypes()
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.device.type == "cpu" and module.weight.dtype in dtypes:
            PackedLinear.convert(module)
            count += 1
    return count
