"""The compiled steps' CPU attention kernel (dflash_core/speed/kernels/cpu_attention.cpp).

Within 1e-6 of SDPA over the same keys (grouped-query heads included), and each output row bitwise
the same alone, beside other rows, and over a cache with more masked slots: what a verify computes
is what its one-token steps compute, whatever the static cache's capacity. In bfloat16 (the
drafter's), the float32 result of the same bfloat16 inputs rounded once, where SDPA's is within a
few roundings of it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dflash_core.speed.kernels import cpu_attention, cpu_rows

pytestmark = pytest.mark.skipif(cpu_rows.unsupported_reason() is not None,
                                reason=f"CPU kernels: {cpu_rows.unsupported_reason()}")


@pytest.fixture(scope="module", autouse=True)
def built():
    assert cpu_attention.prepare()


def causal(rows: int, keys: int, used: int) -> torch.Tensor:
    """[1, 1, rows, keys]: row i sees the `used` cached positions and the block up to itself."""
    return (torch.arange(keys)[None] < (used + 1 + torch.arange(rows))[:, None])[None, None]


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (8, 2), (4, 4)])
@pytest.mark.parametrize("head_dim", [8, 64, 72, 128])
@pytest.mark.parametrize("rows", [1, 4, 16])
def test_it_matches_sdpa_over_the_allowed_keys(heads, kv_heads, head_dim, rows):
    torch.manual_seed(rows * head_dim + heads)
    q = torch.randn(1, heads, rows, head_dim)
    k, v = torch.randn(2, 1, kv_heads, 300, head_dim)
    for mask in (causal(rows, 300, 150), torch.rand(1, 1, rows, 300) < 0.3):
        mask[..., 0] = True  # every row sees a key
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        got = cpu_attention.masked_attention(q, k, v, mask, head_dim**-0.5)
        # Different summation orders: SDPA's kernel differs by CPU (1.01e-6 at an output of 0.8 on
        # the AMX Xeon, 1.3e-6 relative), a few float32 ulps.
        torch.testing.assert_close(got, expected, rtol=4e-6, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_each_row_is_bitwise_the_same_alone_and_over_a_larger_cache(threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q = torch.randn(1, 9, 4, 64)
        k, v = torch.randn(2, 1, 3, 1024, 64)
        block = cpu_attention.masked_attention(q, k, v, causal(4, 1024, 100), 0.125)
        for row in range(4):
            width = 100 + row + 1  # a cache that holds exactly the positions this row sees
            alone = cpu_attention.masked_attention(q[:, :, row:row + 1], k[:, :, :width], v[:, :, :width],
                                                   causal(1, width, 100 + row), 0.125)
            assert torch.equal(alone, block[:, :, row:row + 1])
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("shared", [False, True])
def test_in_bfloat16_it_is_the_float32_result_rounded_once(shared):
    """The drafter's draft step: bfloat16 heads, and one mask row for every block row ([1, P])."""
    torch.manual_seed(7)
    q = torch.randn(1, 9, 4, 64).bfloat16()
    k, v = torch.randn(2, 1, 3, 1280, 64).bfloat16()
    mask = torch.rand(4, 1280) < 0.1 if not shared else (torch.arange(1280) < 160)[None]
    mask[:, 0] = True
    got = cpu_attention.masked_attention(q, k, v, mask, 0.125)
    assert got.dtype == torch.bfloat16 and got.shape == (1, 9, 4, 64)
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=0.125, enable_gqa=True)
    # Rounded once: within half a bfloat16 step of the float32 result, or the next value over at a tie.
    step = torch.finfo(torch.bfloat16).eps * exact.abs().clamp_min(2**-126)
    assert ((got.float() - exact).abs() <= 0.5 * step + 1e-6).all()
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True)
    torch.testing.assert_close(got, sdpa, rtol=2e-2, atol=4e-3)
    if shared:  # one row for all is the same as that row repeated
        assert torch.equal(got, cpu_attention.masked_attention(q, k, v, mask.expand(4, -1).clone(), 0.125))


def test_it_refuses_what_it_does_not_compute():
    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 16, 8)
    mask = torch.ones(1, 1, 1, 16, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        cpu_attention.masked_attention(q.half(), k.half(), k.half(), mask, 1.0)
    with pytest.raises(RuntimeError, match="all of one dtype"):
        cpu_attention.masked_attention(q, k.bfloat16(), k.bfloat16(), mask, 1.0)
    with pytest.raises(RuntimeError, match=r"\[L, P\]"):
        cpu_attention.masked_attention(q, k, k, torch.ones(2, 16, dtype=torch.bool), 1.0)
    with pytest.raises(RuntimeError, match="bool mask"):
        cpu_attention.masked_attention(q, k, k, mask.float(), 1.0)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        cpu_attention.masked_attention(q[..., :6], k[..., :6], k[..., :6], mask, 1.0)
