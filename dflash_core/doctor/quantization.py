"""Telling a weight matrix that was quantized and cast back from one that never was.

A quantized-then-dequantized tensor keeps its values on a grid:

- 4 bits: at most 16 evenly spaced levels per group, a scale each and a zero point (GPTQ, AWQ,
  compressed-tensors' int4: groups of 128 along each row), or per block of 32 a scale (GGUF Q4_0,
  levels -8..7) or a scale and a minimum (GGUF Q4_1; the 4-bit k-quants' sub-blocks look alike);
- 8 bits: integer multiples of one scale per row, per group of 128 (int8 symmetric) or per block of
  32 (GGUF Q8_0);
- float8 e4m3 values times one scale per 128x128 block (the fine-grained FP8 of DeepSeek-V3 and
  the Qwen3 FP8 releases), per row, per tensor, or none.

Genuine trained weights land on such a grid by chance with a probability that vanishes over a few
dozen values. Stored in a 16-bit float the grid points are rounded again: the 4-bit test allows for
that rounding, and the 8-bit tests read only the values near zero (where it is finer than the grid).
Which formats a checkpoint stores quantized, as files, is `formats.py`'s job.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest float8 e4m3fn value
SHARE = 0.99  # of the tested values on the grid
GROUP_SHARE = 0.95  # of a tensor's groups on a 16-level grid (a group missing two neighbouring levels fails)
MIN_TESTED = 64  # values needed for a verdict
MAX_GROUPS = 2048  # groups the 4-bit test reads: plenty for a verdict, and fast on a large matrix
BLOCK = 32  # GGUF's block
GROUP = 128  # the usual group of GPTQ, AWQ and compressed-tensors, and the side of fp8's weight blocks


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
    """Rows of `w` (size None) or groups of `size` along each row; None where rows do not split so."""
    if size is None:
        return w
    if w.shape[-1] % size:
        return None
    return w.reshape(-1, size)


def _scaled(groups: torch.Tensor, top: float) -> torch.Tensor:
    amax = groups.abs().amax(dim=-1, keepdim=True)
    return groups / torch.where(amax > 0, amax / top, torch.ones_like(amax))


def _sixteen_levels(groups: torch.Tensor, err: float) -> tuple[bool, bool]:
    """Whether the groups lie on grids of at most 16 evenly spaced levels (a spacing per group), and
    whether zero is one of the levels (a scale, or a scale and an integer zero point) rather than
    the grid starting at an arbitrary minimum. Reads at most MAX_GROUPS groups, spread over the tensor."""
    groups = groups[:: max(1, len(groups) // MAX_GROUPS)]
    low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
    varied = (high > low)[:, 0]
    if int(varied.sum()) * groups.shape[-1] < MIN_TESTED:
        return False, False
    groups, low, span = groups[varied], low[varied], (high - low)[varied]
    # Storage may merge two levels, never split one: more than 16 distinct values rule a group out.
    distinct = (groups.sort(dim=-1).values.diff(dim=-1) > 0).sum(dim=-1) + 1
    if float((distinct <= 16).float().mean()) < GROUP_SHARE:
        return False, False
    # A stored value is off by up to |value| * err, the group's low and high likewise.
    reach = 4 * err * groups.abs().amax(dim=-1, keepdim=True)
    on = torch.zeros(len(groups), dtype=torch.bool)
    step = torch.zeros_like(span)
    for intervals in range(15, 0, -1):  # the coarsest grid that fits wins: its step is the scale
        trial = span / intervals
        index = (groups - low) / trial
        fits = ((index - index.round()).abs() <= 0.02 + reach / trial).all(dim=-1)
        step[fits] = trial[fits]
        on |= fits
    if float(on.float().mean()) < GROUP_SHARE:
        return False, False
    zero = -low[on] / step[on]
    return True, float(((zero - zero.round()).abs() <= 0.02 + reach[on] / step[on]).float().mean()) >= GROUP_SHARE


def _block_scaled(w: torch.Tensor, side: int, top: float) -> torch.Tensor | None:
    """`w` over one scale per `side` x `side` block (its absolute max / `top`; edge blocks as far as
    the matrix goes), or None where the matrix is not larger than one block."""
    rows, cols = w.shape
    if rows <= side and cols <= side:
        return None
    padded = torch.nn.functional.pad(w.abs(), (0, -cols % side, 0, -rows % side))
    amax = padded.reshape(padded.shape[0] // side, side, padded.shape[1] // side, side).amax(dim=(1, 3))
    amax = amax.repeat_interleave(side, 0).repeat_interleave(side, 1)[:rows, :cols]
    return w / torch.where(amax > 0, amax / top, torch.ones_like(amax))


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
    # Fewest levels first: a 4-bit grid is also an 8-bit one, and a group of 128 holds blocks of 32.
    groups, blocks = _groups(w, GROUP), _groups(w, BLOCK)
    if groups is not None and _sixteen_levels(groups, err)[0]:
        return "int4 in groups of 128, a scale and a zero point each (like GPTQ / AWQ)"
    if blocks is not None:
        four_bit, zero_on_grid = _sixteen_levels(blocks, err)
        if four_bit:
            if zero_on_grid:
                return "4-bit blocks of 32, a scale each (like GGUF Q4_0)"
            return "4-bit blocks of 32, a scale and a minimum each (like GGUF Q4_1 or Q4_K)"
    if _on_integer_grid(_scaled(w, 127), err):
        return "int8 (one scale per row)"
    if groups is not None and _on_integer_grid(_scaled(groups, 127), err):
        return "int8 symmetric in groups of 128 (one scale per group)"
    if blocks is not None and _on_integer_grid(_scaled(blocks, 127), err):
        return "8-bit blocks of 32 (like GGUF Q8_0)"
    tensor_scale = w / (w.abs().max() / FP8_MAX)
    block_scale = _block_scaled(w, GROUP, FP8_MAX)
    for words, f in (("fp8 e4m3 (no scale)", w), ("fp8 e4m3 (one scale per tensor)", tensor_scale),
                     ("fp8 e4m3 (one scale per row)", _scaled(w, FP8_MAX)),
                     ("fp8 e4m3 (one scale per 128x128 block, like DeepSeek-V3's and Qwen3's FP8)", block_scale)):
        if f is not None and _on_fp8_grid(f, err):
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
