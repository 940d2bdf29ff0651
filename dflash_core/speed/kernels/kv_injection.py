"""KV injection for one drafter layer: k_norm + RoPE on keys, keys and values into the drafter cache.

In every drafter layer the keys of [new context; block] go through the per-head RMSNorm `k_norm`,
are rotated by RoPE at their absolute positions, and are stored with the values in the
preallocated `DrafterCache` buffers at [cache.length, cache.length + n) (docs/design.md §2). PyTorch does
that as ~10 kernels plus two strided copies; the Triton kernel does it in one launch per layer,
reading each projected row once and writing it straight into the cache slot.

Shapes: k, v [b, n, kv_heads, head_dim] (keys before k_norm), cos/sin [b, n, head_dim]
(rotate-half convention, as `drafter.apply_rope`), cache buffers [b, kv_heads, capacity, head_dim].

Numerics: the reference follows the PyTorch modules op by op (RMSNorm in fp32, result cast to the
input dtype, RoPE in the input dtype). The kernel computes everything in fp32 and rounds once on
store. Stated bounds (tests/test_kernels.py): fp32 inputs, |kernel - reference| <= 1e-5 absolute;
bf16 inputs, kernel vs the fp32 reference on the same (bf16-representable) inputs <= 2e-2 absolute
(normalised keys have magnitude ~1, so that is a few bf16 ulps).
"""

import functools

import torch

from .backend import interpreting

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference still works
    triton = tl = None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def inject_kv_reference(k, v, k_norm_weight, eps, cos, sin, cache_k, cache_v, offset: int) -> None:
    """PyTorch reference: exactly the ops the drafter ran before the kernel existed."""
    dtype = k.dtype
    x = k.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    k = (k_norm_weight * x.to(dtype)).transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    k = k * cos + _rotate_half(k) * sin
    n = k.shape[2]
    cache_k[:, :, offset : offset + n] = k
    cache_v[:, :, offset : offset + n] = v.transpose(1, 2)


if triton is not None:

    def _kv_injection_kernel(
        k_ptr, v_ptr, w_ptr, cos_ptr, sin_ptr, ck_ptr, cv_ptr,
        n, offset, eps,
        sk_b, sk_n, sk_h,
        sv_b, sv_n, sv_h,
        sc_b, sc_n,
        ss_b, ss_n,
        sck_b, sck_h, sck_p,
        scv_b, scv_h, scv_p,
        HALF: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # One program per (batch*position, kv head): a row is only head_dim wide, so one
        # program owns it entirely and the norm's reduction never leaves registers.
        row = tl.program_id(0)
        head = tl.program_id(1)
        b = row // n
        i = row % n
        offs = tl.arange(0, BLOCK)
        mask = offs < HALF

        # Halves are loaded separately because rotate-half pairs element j with j + HALF.
        k_row = k_ptr + b * sk_b + i * sk_n + head * sk_h
        x1 = tl.load(k_row + offs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(k_row + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        inv_rms = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF) + eps)
        w1 = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        y1 = x1 * inv_rms * w1
        y2 = x2 * inv_rms * w2

        c_row = cos_ptr + b * sc_b + i * sc_n
        s_row = sin_ptr + b * ss_b + i * ss_n
        c1 = tl.load(c_row + offs, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(c_row + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(s_row + offs, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(s_row + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        o1 = y1 * c1 - y2 * s1
        o2 = y2 * c2 + y1 * s2

        dst_k = ck_ptr + b * sck_b + head * sck_h + (offset + i) * sck_p
        tl.store(dst_k + offs, o1.to(ck_ptr.dtype.element_ty), mask=mask)
        tl.store(dst_k + HALF + offs, o2.to(ck_ptr.dtype.element_ty), mask=mask)

        v_row = v_ptr + b * sv_b + i * sv_n + head * sv_h
        dst_v = cv_ptr + b * scv_b + head * scv_h + (offset + i) * scv_p
        tl.store(dst_v + offs, tl.load(v_row + offs, mask=mask), mask=mask)
        tl.store(dst_v + HALF + offs, tl.load(v_row + HALF + offs, mask=mask), mask=mask)


@functools.cache
def _compiled(interpret: bool):
    # triton.jit picks interpreter vs compiler when it wraps the function, so the wrapper is
    # built lazily and per mode: importing this module never commits to either.
    del interpret  # only the cache key
    return triton.jit(_kv_injection_kernel)


def inject_kv_triton(k, v, k_norm_weight, eps, cos, sin, cache_k, cache_v, offset: int) -> None:
    """Triton version of `inject_kv_reference` (same arguments, same effect)."""
    b, n, heads, dim = k.shape
    if dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {dim}")
    # The kernel assumes unit stride along head_dim; projections and caches have it already.
    k, v, cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v, cos, sin))
    if cache_k.stride(-1) != 1 or cache_v.stride(-1) != 1:
        raise ValueError("cache buffers must be contiguous along head_dim")
    if n == 0:
        return
    half = dim // 2
    _compiled(interpreting())[(b * n, heads)](
        k, v, k_norm_weight, cos, sin, cache_k, cache_v,
        n, offset, float(eps),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        cos.stride(0), cos.stride(1),
        sin.stride(0), sin.stride(1),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        HALF=half,
        BLOCK=triton.next_power_of_2(half),
    )
