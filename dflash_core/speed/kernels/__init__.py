"""Fused Triton kernels for the decoding hot path, and the switch that picks them or PyTorch.

Two kernels (see their modules): `kv_injection` (k_norm + RoPE + drafter-cache write, one launch
per drafter layer) and `verify` (greedy choice per block slot, accepted count and bonus token, one
launch per cycle). Each module holds its kernel and its exact PyTorch reference with the same
signature; the references are what runs on CPU and what the tests compare against. `cuda_paths` holds the
CUDA-only extras (flash-attn for the drafter's attention, CUDA-graph capture), untested without a GPU.
The CPU's few-row linears (float32, bfloat16) have a C++ kernel of their own, `cpu_rows`, outside this switch:
`cpu_linear.py` decides where it runs, and the libraries' linears are its reference.

Backend choice, per call, from the environment variable `DFLASH_KERNELS`:
  - `auto` (default): Triton when the tensors are on CUDA and `triton` imports, PyTorch otherwise;
    a kernel that fails to compile or launch falls back to its reference for the rest of the
    process, with one `FallbackWarning` naming the error (`run_kernel`);
  - `torch`: always the PyTorch references;
  - `triton`: always Triton; on CPU tensors this only works under `TRITON_INTERPRET=1` (Triton's
    interpreter, slow, used by the tests), otherwise it raises `KernelUnavailableError`.
The variable is read on every call so tests and benchmarks can flip it without reloading modules.
Triton launches on the current CUDA device, so every launch runs under `torch.cuda.device` of its
tensors' own device (`cuda:N`).
"""

from __future__ import annotations

import contextlib

import torch

from ..fallbacks import notice
from .backend import KernelUnavailableError, interpreting, mode, triton_available, use_triton

__all__ = ["KernelUnavailableError", "interpreting", "mode", "triton_available", "use_triton",
           "inject_kv", "greedy_verify", "project_kv", "run_kernel", "on_device", "describe_backend"]

# Kernels that failed in auto mode, with the error: they run as references from then on.
BROKEN: dict[str, str] = {}


def on_device(device: torch.device):
    """`torch.cuda.device(device)` for CUDA tensors (Triton launches on the current device), else nothing."""
    device = torch.device(device)
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def run_kernel(name: str, triton_fn, reference_fn, device: torch.device, *args):
    """`triton_fn(*args)` where `use_triton(device)`, else `reference_fn(*args)`.

    In auto mode a Triton error (compile, launch, unsupported GPU) switches this kernel to its
    reference for good, with one warning naming the error; DFLASH_KERNELS=triton lets it raise.
    """
    if not use_triton(device) or (name in BROKEN and mode() == "auto"):
        return reference_fn(*args)
    try:
        with on_device(device):
            return triton_fn(*args)
    except Exception as exc:  # noqa: BLE001 - any failure of the optional path
        if mode() == "triton":
            raise
        BROKEN[name] = f"{type(exc).__name__}: {exc}"
        notice(f"Triton kernel {name} failed on {device} ({BROKEN[name]}); using its PyTorch reference")
        return reference_fn(*args)


def describe_backend(device: torch.device | str) -> str:
    """Which implementation the kernels use on `device`, in words (reports, benchmarks)."""
    if not use_triton(device):
        return "torch"
    return "triton" + (f" (fell back to torch: {', '.join(sorted(BROKEN))})" if BROKEN else "")


def inject_kv(cache, layer: int, k, v, k_norm_weight, eps: float, cos, sin):
    """k_norm + RoPE on keys, then keys and values into `cache` for `layer`; returns its filled K/V views.

    k, v: [b, n, kv_heads, head_dim] projections of [new context; block] (keys before k_norm);
    cos, sin: [b, n, head_dim]. Written at positions [cache.length, cache.length + n).
    """
    from . import kv_injection

    end = cache.length + k.shape[1]
    buf_k, buf_v = cache.reserve(layer, end, k.shape[0], k.shape[2], k.shape[3], k.dtype, k.device)
    run_kernel(
        "kv_injection", kv_injection.inject_kv_triton, kv_injection.inject_kv_reference, k.device,
        k, v, k_norm_weight, eps, cos, sin, buf_k, buf_v, cache.length,
    )
    return buf_k[:, :, :end], buf_v[:, :, :end]


def greedy_verify(draft_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[accepted, bonus] (int64, on the logits' device, no host sync) for greedy acceptance."""
    from . import verify

    return run_kernel(
        "greedy_verify", verify.verify_triton, verify.greedy_verify_reference, logits.device, draft_ids, logits
    )


def project_kv(k_proj: torch.nn.Linear, v_proj: torch.nn.Linear, x: torch.Tensor):
    """`(k_proj(x), v_proj(x))`, as one matmul on a concatenated weight where that is safe and helps.

    On CUDA without autograd (decoding) the two projections read the same input, so one GEMM on
    [W_k; W_v] saves a launch per layer and reads `x` once. Elsewhere (CPU, where the golden
    traces are defined, and training) it is the two plain Linear calls.
    """
    if x.is_cuda and not torch.is_grad_enabled() and mode() != "torch":
        fused = fused_kv_projection(k_proj, v_proj, x)
        if fused is not None:
            return fused
    return k_proj(x), v_proj(x)


def fused_kv_projection(k_proj: torch.nn.Linear, v_proj: torch.nn.Linear, x: torch.Tensor):
    """One GEMM for both projections, or None when the weights' versions cannot be tracked.

    The concatenated weight is cached on `k_proj` and rebuilt whenever either weight changes
    (same storage and version counter, or it is stale).
    """
    try:
        key = (k_proj.weight.data_ptr(), k_proj.weight._version, v_proj.weight.data_ptr(), v_proj.weight._version)
    except RuntimeError:  # parameters created in inference mode carry no version counter
        return None
    cached = getattr(k_proj, "_dflash_fused_kv", None)
    if cached is None or cached[0] != key:
        weight = torch.cat([k_proj.weight, v_proj.weight])
        bias = None if k_proj.bias is None else torch.cat([k_proj.bias, v_proj.bias])
        cached = (key, weight, bias)
        k_proj._dflash_fused_kv = cached
    kv = torch.nn.functional.linear(x, cached[1], cached[2])
    split = k_proj.out_features
    return kv[..., :split], kv[..., split:]
