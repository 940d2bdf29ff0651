"""Optional fast paths that fail soft, and the one-line notices that say so.

- flash-attn (the drafter's attention on CUDA) is used only when it imports and a tiny call runs on
  the device in the loaded dtype; otherwise PyTorch SDPA, with one notice saying why.
- The Triton kernels (`kernels/`) fall back to their PyTorch references on any compile or launch
  error, with one notice naming the error (`kernels.run_kernel`).
A notice is a `FallbackWarning` (one line, once per message per process); `NOTICES` keeps them for
reports such as scripts/gpu_check.py.
"""

from __future__ import annotations

import functools
import warnings

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)
NOTICES: list[str] = []


class FallbackWarning(RuntimeWarning):
    """An optional fast path is off; the engine runs its plain PyTorch equivalent."""


def notice(message: str) -> None:
    """Warn once per distinct message (`FallbackWarning`)."""
    if message in NOTICES:
        return
    NOTICES.append(message)
    warnings.warn(message, FallbackWarning, stacklevel=3)


def flash_attn_usable(device: torch.device | str, dtype: torch.dtype):
    """(flash_attn_func or None, why in words) for attention on `device` in `dtype`."""
    device = torch.device(device)
    if device.type != "cuda":
        return None, f"flash-attn needs CUDA, not {device.type}"
    if dtype not in HALF_DTYPES:
        return None, f"flash-attn runs only float16/bfloat16, and the model is {str(dtype).removeprefix('torch.')}"
    return probe_flash_attn(device, dtype)


@functools.cache
def probe_flash_attn(device: torch.device, dtype: torch.dtype):
    """Import flash-attn and run one tiny non-causal call on `device` in `dtype` (once per pair)."""
    try:
        import flash_attn
        from flash_attn import flash_attn_func
    except Exception as exc:  # noqa: BLE001 - a missing or broken build must not stop decoding
        return None, f"flash-attn does not import ({type(exc).__name__}: {exc})"
    try:
        q = torch.zeros(1, 4, 2, 64, device=device, dtype=dtype)  # [b, seq, heads, d]
        flash_attn_func(q, q, q, causal=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a launch failure shows only at the next sync
    except Exception as exc:  # noqa: BLE001 - e.g. built for another GPU architecture or torch
        return None, f"flash-attn {getattr(flash_attn, '__version__', '?')} failed a test call on {device} in {dtype} ({type(exc).__name__}: {exc})"
    return flash_attn_func, f"flash-attn {getattr(flash_attn, '__version__', '?')}"


def drafter_flash_attn(device: torch.device, dtype: torch.dtype):
    """flash_attn_func for the drafter's attention, or None (with one notice on CUDA saying why)."""
    func, why = flash_attn_usable(device, dtype)
    if func is None and device.type == "cuda":
        notice(f"drafter attention on {device} uses PyTorch SDPA: {why}")
    return func


def attention_report(device: torch.device | str, dtype: torch.dtype) -> dict:
    """Which attention the target and the drafter use here, in words."""
    func, why = flash_attn_usable(device, dtype)
    return {
        "target": "sdpa (see target.default_attention)",
        "drafter": "flash-attn" if func is not None else "sdpa",
        "flash_attn": why,
    }
