"""Telling a weight matrix that was quantized and cast back from one that never was.

A quantized-then-dequantized tensor keeps its values on a grid: integer multiples of one scale per
row or per block of 32 (int8, GGUF's Q8_0), 16 levels between a block's min and max (Q4_1), or
the float8 e4m3 values times one scale (per tensor, per row, or none). Genuine trained weights
land on such a grid by chance with a probability that vanishes over a few dozen values. Stored in
a 16-bit float the grid points are rounded again, so only the values near zero (where that
rounding is finer than the grid) are tested.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest float8 e4m3fn value
SHARE = 0.99  # of the tested values on the grid
MIN_TESTED = 64  # values needed for a verdict
BLOCK = 32


def _relative_error(dtype: torch.dtype) -> float:
    """Half a unit in the last place, relative, of the dtype the tensor was stored in."""
    return torch.finfo(dtype).eps / 2 if dtype.is_floating_point else 0.0


def _on_integer_grid(q: torch.Tensor, err: float, limit: float = 16.0) -> bool:
    near_zero = q.abs() <= limit
    values = q[near_zero]
    if values.numel() < MIN_TESTED:
        return False
    tolerance = 1e-3 + values.abs() * err * 2
    return bool(((values - values.round()).abs() <= tolerance).float().mean() >= SHARE)


def _groups(w: torch.Tensor, size: int | None) -> torch.Tensor | None:
    """Rows of `w` (size None) or blocks of `size` along each row; None where rows do not split so."""
    if size is None:
        return w
    if w.shape[-1] % size:
        return None
    return w.reshape(-1, size)


def _scaled(groups: torch.Tensor, top: float) -> torch.Tensor:
    amax = groups.abs().amax(dim=-1, keepdim=True)
    return groups / torch.where(amax > 0, amax / top, torch.ones_like(amax))


def _on_fp8_grid(f: torch.Tensor, err: float) -> bool:
    values = f[(f != 0) & (f.abs() <= FP8_MAX)]
    if values.numel() < MIN_TESTED or not hasattr(torch, "float8_e4m3fn"):
        return False
    back = values.to(torch.float8_e4m3fn).float()
    return bool(((back - values).abs() <= values.abs() * err * 2 + 1e-12).float().mean() >= SHARE)


def quantization_grid(weight: torch.Tensor) -> str | None:
    """The grid `weight` (a 2-D tensor as stored) lies on, in words, or None for none found."""
    if weight.dim() != 2 or not weight.is_floating_point() or weight.numel() < MIN_TESTED:
        return None
    err = _relative_error(weight.dtype)
    w = weight.detach().float().cpu()
    if w.unique().numel() < 16:  # constant or nearly so (zeros, a fresh init): nothing to tell
        return None
    rows, blocks = _groups(w, None), _groups(w, BLOCK)
    if _on_integer_grid(_scaled(rows, 127), err):
        return "int8 (one scale per row)"
    if blocks is not None:
        if _on_integer_grid(_scaled(blocks, 127), err):
            return "8-bit blocks of 32 (like GGUF Q8_0)"
        low, high = blocks.amin(dim=-1, keepdim=True), blocks.amax(dim=-1, keepdim=True)
        levels = (blocks - low) / torch.where(high > low, (high - low) / 15, torch.ones_like(high))
        if _on_integer_grid(levels, err):
            return "4-bit blocks of 32 (like GGUF Q4_1)"
    tensor_scale = w / (w.abs().max() / FP8_MAX)
    for words, f in (("fp8 e4m3 (no scale)", w), ("fp8 e4m3 (one scale per tensor)", tensor_scale),
                     ("fp8 e4m3 (one scale per row)", _scaled(rows, FP8_MAX))):
        if _on_fp8_grid(f, err):
            return words
    return None


def quantized_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """Name -> grid, for the 2-D floating tensors that lie on a quantization grid."""
    found = {}
    for name, tensor in tensors.items():
        grid = quantization_grid(tensor)
        if grid is not None:
            found[name] = grid
    return found
