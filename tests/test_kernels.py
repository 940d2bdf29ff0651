"""Fused kernels (dflash_core/speed/kernels) against their exact PyTorch references.

On a machine without CUDA the Triton kernels run in Triton's interpreter, which `tests/conftest.py`
turns on before anything imports triton (`test_kernels_compile.py` checks the compiled path). With
CUDA (scripts/gpu_check.py) the same tests run the compiled kernels on the GPU.

Error bounds (also in kernels/kv_injection.py):
  - KV injection, fp32 inputs: |kernel - reference| <= 1e-5 absolute (rtol 1e-5);
  - KV injection, bf16 inputs vs the fp32 reference on the same values: <= 2e-2 absolute plus
    1e-2 relative (a couple of bf16 ulps of outputs of magnitude up to ~5);
  - greedy verification: exactly equal, ties included.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the Triton kernels run on CPU only in Triton's interpreter: TRITON_INTERPRET=1 before "
                "triton's first import (tests/conftest.py sets it on machines without a GPU)", allow_module_level=True)

from triton_support import interpreter_skip_reason

if DEVICE == "cpu" and interpreter_skip_reason():
    pytest.skip(interpreter_skip_reason(), allow_module_level=True)

from dflash_core.models.drafter import DrafterCache
from dflash_core.speed import kernels  # noqa: E402
from dflash_core.speed.kernels.kv_injection import inject_kv_reference, inject_kv_triton
from dflash_core.speed.kernels.verify import greedy_verify_reference, verify_triton

pytest.importorskip("triton")

FP32_TOL = dict(atol=1e-5, rtol=1e-5)
BF16_TOL = dict(atol=2e-2, rtol=1e-2)


@pytest.fixture(autouse=True)
def triton_backend(monkeypatch):
    monkeypatch.setenv("DFLASH_KERNELS", "triton")


def rope_tables(positions: torch.Tensor, dim: int, theta: float = 1e6):
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
    angles = positions[:, :, None].float() * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def kv_inputs(batch, n, kv_heads, dim, start, dtype, gen):
    k = torch.randn(batch, n, kv_heads, dim, generator=gen).to(DEVICE, dtype)
    v = torch.randn(batch, n, kv_heads, dim, generator=gen).to(DEVICE, dtype)
    weight = (torch.rand(dim, generator=gen) + 0.5).to(DEVICE, dtype)
    positions = torch.arange(start, start + n, device=DEVICE).expand(batch, n)
    cos, sin = rope_tables(positions, dim)
    return k, v, weight, cos.to(dtype), sin.to(dtype)


# (query heads, kv heads): GQA 4:1, 8:1 and plain multi-head 1:1. Only kv heads reach the
# kernel, but the ratio fixes how many there are for a given model width.
HEADS = [(8, 2), (8, 1), (4, 4)]


@pytest.mark.parametrize(
    "heads,head_dim",
    [(HEADS[0], 128), (HEADS[1], 64), (HEADS[2], 64), (HEADS[2], 128)],
    ids=lambda x: f"{x[0]}q{x[1]}kv" if isinstance(x, tuple) else f"d{x}",
)
@pytest.mark.parametrize("block", [1, 8, 16])
def test_kv_injection_fp32_matches_reference_after_crop(heads, head_dim, block):
    """Two cycles through a DrafterCache, the second written after cropping the cache back."""
    gen = torch.Generator().manual_seed(hash((heads, head_dim, block)) % 2**31)
    _, kv_heads = heads
    caches = {"torch": DrafterCache(1), "triton": DrafterCache(1)}
    # cycle 1: 11 context positions + block from 0; cycle 2: cropped back to 6, 3 new context + block.
    for start, n_context, crop in [(0, 11, None), (6, 3, 6)]:
        inputs = kv_inputs(1, n_context + block, kv_heads, head_dim, start, torch.float32, gen)
        out = {}
        for name, cache in caches.items():
            if crop is not None:
                cache.crop(crop)
            assert cache.length == start
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("DFLASH_KERNELS", name)
                out[name] = kernels.inject_kv(cache, 0, *inputs[:3], 1e-6, *inputs[3:])
            cache.commit(n_context)
        for a, b in zip(out["triton"], out["torch"]):
            torch.testing.assert_close(a, b, **FP32_TOL)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("batch,n,kv_heads", [(1, 16, 8), (2, 9, 2)])
def test_kv_injection_bf16_against_fp32_reference(head_dim, batch, n, kv_heads):
    gen = torch.Generator().manual_seed(7 + head_dim + n)
    k, v, weight, cos, sin = kv_inputs(batch, n, kv_heads, head_dim, 37, torch.bfloat16, gen)
    shape = (batch, kv_heads, 64, head_dim)
    ref_k, ref_v = torch.zeros(shape, device=DEVICE), torch.zeros(shape, device=DEVICE)
    inject_kv_reference(k.float(), v.float(), weight.float(), 1e-6, cos.float(), sin.float(), ref_k, ref_v, 20)
    out_k = torch.zeros(shape, dtype=torch.bfloat16, device=DEVICE)
    out_v = torch.zeros_like(out_k)
    inject_kv_triton(k, v, weight, 1e-6, cos, sin, out_k, out_v, 20)
    torch.testing.assert_close(out_k.float(), ref_k, **BF16_TOL)
    torch.testing.assert_close(out_v.float(), ref_v, atol=0, rtol=0)  # values are copied, not computed


def test_fused_kv_projection_matches_two_linears_and_tracks_weight_updates():
    gen = torch.Generator().manual_seed(5)
    k_proj, v_proj = torch.nn.Linear(64, 32, bias=True), torch.nn.Linear(64, 32, bias=True)
    x = torch.randn(1, 11, 64, generator=gen)
    with torch.no_grad():
        for _ in range(2):
            k, v = kernels.fused_kv_projection(k_proj, v_proj, x)
            torch.testing.assert_close(k, k_proj(x), **FP32_TOL)
            torch.testing.assert_close(v, v_proj(x), **FP32_TOL)
            assert k.view(1, 11, 4, 8).shape == (1, 11, 4, 8)  # splits into heads without a copy
            v_proj.weight.add_(1.0)  # an optimizer step: the cached concatenation must be rebuilt


def drafts_from(choice: torch.Tensor, gen: torch.Generator) -> list[torch.Tensor]:
    """Draft ids accepting everything, nothing, and a random prefix of the target's choices."""
    n = choice.shape[0] - 1
    drafts = [choice[:-1].clone()]
    for _ in range(2):
        draft = choice[:-1].clone()
        if n:
            i = int(torch.randint(0, n, (1,), generator=gen))
            draft[i] = (draft[i] + 1) % 997
        drafts.append(draft)
    return drafts


@pytest.mark.parametrize("vocab", [1000, 4099])
@pytest.mark.parametrize("block", [1, 8, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_greedy_verify_exact(vocab, block, dtype):
    gen = torch.Generator().manual_seed(vocab + block)
    logits = torch.randn(block, vocab, generator=gen).to(DEVICE, dtype)
    for i, draft in enumerate(drafts_from(logits.argmax(-1), gen)):
        expected = greedy_verify_reference(draft, logits).tolist()
        assert verify_triton(draft, logits).tolist() == expected
        if i == 0:  # small chunks and slices: several chunks per slice, ragged last chunk and slice
            assert verify_triton(draft, logits, block=256, split_size=768).tolist() == expected


@pytest.mark.parametrize("vocab", [1000, 4099])
def test_greedy_verify_ties_take_the_first_index(vocab):
    gen = torch.Generator().manual_seed(3)
    # Few distinct values: every row is full of ties, within and across the kernel's chunks.
    logits = torch.randint(0, 3, (16, vocab), generator=gen).float().to(DEVICE)
    logits[1, :] = 5.0  # a whole row tied: argmax is 0
    logits[2, [vocab - 1, 2049 % vocab, 7]] = 9.0  # tied maxima in different chunks
    choice = logits.argmax(-1)
    assert choice[1] == 0 and choice[2] == 7
    for i, draft in enumerate(drafts_from(choice, gen)):
        expected = greedy_verify_reference(draft, logits).tolist()
        assert verify_triton(draft, logits).tolist() == expected
        if i == 0:
            assert verify_triton(draft, logits, block=256, split_size=512).tolist() == expected
    bf16 = logits.bfloat16()
    draft = choice[:-1]
    assert verify_triton(draft, bf16).tolist() == greedy_verify_reference(draft, bf16).tolist() == [15, int(choice[15])]


def test_dispatch_switch(monkeypatch):
    monkeypatch.setenv("DFLASH_KERNELS", "auto")
    assert kernels.use_triton("cpu") is False
    monkeypatch.setenv("DFLASH_KERNELS", "torch")
    assert kernels.use_triton(DEVICE) is False
    monkeypatch.setenv("DFLASH_KERNELS", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(kernels.KernelUnavailableError, match="TRITON_INTERPRET=1"):
        kernels.use_triton("cpu")
    monkeypatch.setenv("DFLASH_KERNELS", "fast")
    with pytest.raises(kernels.KernelUnavailableError, match="DFLASH_KERNELS"):
        kernels.use_triton("cpu")


def test_decoding_with_kernels_equals_without(golden_dir, golden_expected, monkeypatch):
    """End to end on the golden pair: one prompt, block 8, 40 tokens, kernels forced on vs off."""
    from dflash_core import DFlashDrafter, Target, run

    target = Target.from_pretrained(golden_dir / "target", device=DEVICE)
    drafter = DFlashDrafter.from_pretrained(golden_dir / "drafter", device=DEVICE)
    prompt = golden_expected["prompts"][0]["prompt_ids"]
    results = {}
    for name in ("torch", "triton"):
        monkeypatch.setenv("DFLASH_KERNELS", name)
        summary = run(target, prompt, drafter, max_new_tokens=40, block_size=8)
        results[name] = (summary.output_ids, [b.accepted for b in summary.blocks])
    assert results["triton"] == results["torch"]
    expected = next(r for r in golden_expected["prompts"][0]["runs"] if r["block_size"] == 8)
    if DEVICE == "cpu":  # the golden traces were made on CPU in fp32
        assert list(results["triton"][0]) == expected["output_ids"]
