"""Batch-invariant verification: a verified block is bitwise what one-token steps compute."""

from __future__ import annotations

import pytest
import torch
from tiny import build_drafter, build_target
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from dflash_core import DFlashDrafter, Target, run
from dflash_core.errors import GenerationInputError
from dflash_core.speed.batch_invariant import (
    MAX_BLOCK,
    describe,
    is_batch_invariant,
    make_batch_invariant,
    register,
    rows_alone_from,
    rows_alone_layers,
    run_rows_alone,
)
from dflash_core.speed.cpu_linear import pack_linears
from dflash_core.speed.kernels import cpu_attention


@pytest.fixture(scope="module")
def wide_target_dir(tmp_path_factory):
    # Wide enough for SDPA's and oneDNN's tiling to differ between a block and a single row; the
    # MLP is SmolLM2's, whose 1536-long down_proj reduction oneDNN splits by row count on some CPUs.
    return build_target(tmp_path_factory.mktemp("wide") / "target", num_layers=4, hidden=128, intermediate=1536)


def block_and_steps(target: Target, ids: torch.Tensor, context: int):
    """Logits and features of ids[context:] as one block, then as one-token steps."""
    target.reset()
    target.forward(ids[:, :context])
    block_logits, block_features = target.forward(ids[:, context:])
    target.crop(context)
    steps = [target.forward(ids[:, i : i + 1]) for i in range(context, ids.shape[1])]
    return (block_logits, block_features), (torch.cat([s[0] for s in steps]), torch.cat([s[1] for s in steps], dim=1))


def test_bf16_on_cpu_is_batch_invariant_by_default_and_fp32_is_not(wide_target_dir):
    assert is_batch_invariant(Target.from_pretrained(wide_target_dir, dtype=torch.bfloat16).model)
    assert not is_batch_invariant(Target.from_pretrained(wide_target_dir, dtype=torch.float32).model)


@pytest.fixture(params=["kernel", "row loop"])
def attention(request, monkeypatch):
    """Blocks attend through the masked-attention kernel (with one-token steps) or one query row at a time."""
    if request.param == "kernel" and not cpu_attention.row_invariant_ready():
        pytest.skip("the masked-attention kernel does not run on this machine (it needs x86 with AVX2 and a compiler)")
    if request.param == "row loop":
        monkeypatch.setattr(cpu_attention, "row_invariant_ready", lambda: False)
    return request.param


@pytest.mark.parametrize("block_size", [2, 3, 8, 16])
def test_bf16_block_is_bitwise_one_token_steps(wide_target_dir, block_size, attention):
    target = Target.from_pretrained(wide_target_dir, dtype=torch.bfloat16)
    target.tap_layers([0, 2, 3])
    for seed, context in enumerate((1, 17, 90)):
        ids = torch.randint(0, target.vocab_size, (1, context + block_size), generator=torch.Generator().manual_seed(seed))
        (block_logits, block_features), (step_logits, step_features) = block_and_steps(target, ids, context)
        assert torch.equal(block_logits, step_logits), (seed, context)
        assert torch.equal(block_features, step_features), (seed, context)


def test_bf16_dflash_equals_plain_decoding(wide_target_dir, tmp_path):
    target = Target.from_pretrained(wide_target_dir, dtype=torch.bfloat16)
    drafter = DFlashDrafter.from_pretrained(build_drafter(tmp_path / "drafter", wide_target_dir), dtype=torch.bfloat16)
    # Near-ties are what bf16 flips: flatten the target's scores so that they are common.
    with torch.no_grad():
        target.model.lm_head.weight.div_(8)
    for seed in range(3):
        prompt = torch.randint(0, target.vocab_size, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
        plain = run(target, prompt, max_new_tokens=40).output_ids
        for block_size in (2, 4, 8):
            assert run(target, prompt, drafter, max_new_tokens=40, block_size=block_size).output_ids == plain


def test_a_static_caches_unused_keys_leave_a_blocks_rows_as_without_them(attention):
    """A static cache's mask covers its whole capacity, the keys past the cached ones masked: the
    block's rows are those of a cache that holds only the cached keys."""
    wrapped = ALL_ATTENTION_FUNCTIONS[register("sdpa")]

    class Module(torch.nn.Module):
        num_key_value_groups, is_causal = 3, True

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, h, n, 64, generator=gen).to(torch.bfloat16) for h, n in ((9, 4), (3, 64), (3, 64)))
    for length in (1, 4):
        static = torch.zeros(1, 1, length, 64, dtype=torch.bool)
        static[..., :41] = torch.ones(length, 41, dtype=torch.bool).tril(41 - length)
        query = q[:, :, :length]
        dynamic = torch.ones(1, 1, length, 41, dtype=torch.bool).tril(41 - length)
        out = wrapped(Module(), query, k, v, static)[0]
        assert torch.equal(out, wrapped(Module(), query, k[:, :, :41], v[:, :, :41], dynamic)[0])
    # A prefill into an empty static cache comes with no mask (SDPA's causal one, from the first key).
    prefill = wrapped(Module(), q, k, v, None)[0]
    assert torch.equal(prefill, wrapped(Module(), q, k[:, :, :4], v[:, :, :4], None)[0])


def test_masks_it_cannot_reproduce_go_to_the_base_implementation(monkeypatch):
    monkeypatch.setattr(cpu_attention, "row_invariant_ready", lambda: False)  # the row loop (the kernel: below)
    base, wrapped = ALL_ATTENTION_FUNCTIONS["sdpa"], ALL_ATTENTION_FUNCTIONS[register("sdpa")]

    class Module(torch.nn.Module):
        num_key_value_groups, is_causal = 1, True

    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    padded = torch.ones(1, 1, 3, 7, dtype=torch.bool).tril(4)
    padded[..., 0] = False  # a left-padded sequence: not the causal prefix of every row
    out, _ = wrapped(Module(), q, k, v, padded)
    assert torch.equal(out, base(Module(), q, k, v, padded)[0])
    causal = torch.ones(1, 1, 3, 7, dtype=torch.bool).tril(4)
    out, _ = wrapped(Module(), q, k, v, causal)
    rows = [base(Module(), q[:, :, i : i + 1], k[:, :, : 5 + i], v[:, :, : 5 + i], None)[0] for i in range(3)]
    assert torch.equal(out, torch.cat(rows, dim=1))
    assert torch.allclose(out, base(Module(), q, k, v, causal)[0], atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_through_the_kernel_a_blocks_rows_are_its_one_token_steps_and_close_to_sdpa(attention, dtype, monkeypatch):
    if attention != "kernel":
        pytest.skip("the row loop: test_masks_it_cannot_reproduce_go_to_the_base_implementation")
    calls, kernel = [], cpu_attention.masked_attention
    monkeypatch.setattr(cpu_attention, "masked_attention", lambda *a: calls.append(a[0].shape[2]) or kernel(*a))
    base, wrapped = ALL_ATTENTION_FUNCTIONS["sdpa"], ALL_ATTENTION_FUNCTIONS[register("sdpa")]

    class Module(torch.nn.Module):
        num_key_value_groups, is_causal = 3, True

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 64, generator=gen).to(dtype) for h, n in ((9, 4), (3, 41), (3, 41)))
    causal = torch.ones(1, 1, 4, 41, dtype=torch.bool).tril(37)
    out, _ = wrapped(Module(), q, k, v, causal)
    steps = [wrapped(Module(), q[:, :, i : i + 1], k[:, :, : 38 + i], v[:, :, : 38 + i], None)[0] for i in range(4)]
    assert torch.equal(out, torch.cat(steps, dim=1))
    assert calls == [4, 1, 1, 1, 1]  # the block and each one-token step, all through the kernel
    reference = base(Module(), q.float(), k.float(), v.float(), causal)[0]
    assert torch.allclose(out.float(), reference, atol=1e-5 if dtype == torch.float32 else 2e-2)


@pytest.fixture(scope="module")
def compiled_pair(tmp_path_factory):
    """A random target with SmolLM2-135M's layers (6 of them: inductor fuses their ops otherwise in a
    block's step than in a one-token step from the fourth on) as bf16 on compiled steps, and a
    drafter; scores flattened so that near-ties, which rounding differences flip, are common."""
    if not cpu_attention.row_invariant_ready():
        pytest.skip("compiled batch-invariant steps need the masked-attention kernel (x86 with AVX2 and a compiler)")
    root = tmp_path_factory.mktemp("compiled")
    target_dir = build_target(root / "target", num_layers=6, hidden=576, intermediate=1536, heads=9, kv_heads=3)
    target = Target.from_pretrained(target_dir, dtype=torch.bfloat16, static_cache=True, compiled=True)
    with torch.no_grad():
        target.model.lm_head.weight.div_(8)
    return target, DFlashDrafter.from_pretrained(build_drafter(root / "drafter", target_dir), dtype=torch.bfloat16)


def test_compiled_bf16_steps_keep_blocks_bitwise_one_token_steps(compiled_pair):
    """Compiled (library GEMMs, every intermediate rounded as eager ops round it), a block's verify
    step and one-token steps agree bitwise, and DFlash decodes exactly what plain decoding does."""
    target, drafter = compiled_pair
    assert target.graphs.backend.gemms == "library" and target.graphs.backend.exact_casts
    target.tap_layers(range(6))
    for seed, context in enumerate((17, 90)):
        ids = torch.randint(0, target.vocab_size, (1, context + 4), generator=torch.Generator().manual_seed(seed))
        (block_logits, block_features), (step_logits, step_features) = block_and_steps(target, ids, context)
        assert torch.equal(block_logits, step_logits) and torch.equal(block_features, step_features), (seed, context)
    target.tap_layers(())
    for seed in range(4):
        prompt = torch.randint(0, target.vocab_size, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
        plain = run(target, prompt, max_new_tokens=40).output_ids
        assert run(target, prompt, drafter, max_new_tokens=40, block_size=4).output_ids == plain, seed
    assert all(graph is not None for graph in target.graphs.graphs.values())  # none fell back to eager


def test_compiled_bf16_tree_steps_decode_as_plain_decoding(compiled_pair):
    """A draft tree's verify is a compiled step of its own, its ancestor mask an input, and each
    node computes what a one-token step at its depth would: the walk keeps plain decoding's output."""
    target, drafter = compiled_pair
    for seed in range(3):
        prompt = torch.randint(0, target.vocab_size, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
        plain = run(target, prompt, max_new_tokens=40).output_ids
        for budget in (8, 32) if seed == 0 else (8,):  # 33 nodes: past the chain's 16 rows, as the app's largest tree
            trees = run(target, prompt, drafter, max_new_tokens=40, block_size=4, tree_budget=budget)
            assert trees.output_ids == plain, (seed, budget)
            assert all(block.tree is not None and len(block.tree.tokens) == budget + 1 for block in trees.blocks)
    tree_steps = [graph for key, graph in target.graphs.graphs.items() if key[0][0] == "tree"]
    assert len(tree_steps) == 2 and None not in tree_steps  # compiled, not fallen back to eager


def test_eager_bf16_tree_steps_decode_as_plain_decoding(compiled_pair):
    """Eagerly too, a tree's ancestor mask goes to the masked-attention kernel (not SDPA over every
    key), so each node computes what the one-token step at its depth computes."""
    if not cpu_attention.row_invariant_ready():
        pytest.skip("eager batch-invariant trees attend through the masked-attention kernel")
    compiled, drafter = compiled_pair
    target = Target(compiled.model, compiled.tokenizer)  # eager steps, the same batch-invariant model
    for seed in range(4):
        prompt = torch.randint(0, target.vocab_size, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
        plain = run(target, prompt, max_new_tokens=40).output_ids
        # The longest invariant block (past a tile's rows and the chain's 16) on one prompt: where a
        # CPU's library runs such blocks row by row, they are slow (each row count is checked alone by
        # test_smollm2_linear_shapes_compute_every_block_row_as_alone).
        for budget in (4, 8) if seed else (4, 8, MAX_BLOCK - 1):
            trees = run(target, prompt, drafter, max_new_tokens=40, block_size=4, tree_budget=budget)
            assert trees.output_ids == plain, (seed, budget)
            assert max(len(block.tree.tokens) for block in trees.blocks) == budget + 1


def test_a_tree_past_the_invariant_block_is_refused(compiled_pair):
    """A tree of more nodes than MAX_BLOCK runs its linears as a prefill would, not bitwise as one-token
    steps: refused, with why."""
    target, drafter = compiled_pair
    with pytest.raises(GenerationInputError, match=rf"tree_budget={MAX_BLOCK} verifies {MAX_BLOCK + 1} nodes in one "
                                                   rf"forward, .* use a tree_budget of at most {MAX_BLOCK - 1}"):
        run(target, [1, 2, 3], drafter, max_new_tokens=8, block_size=4, tree_budget=MAX_BLOCK)


def test_a_batch_invariant_target_compiles_with_library_gemms_and_the_kernel_only(wide_target_dir, monkeypatch):
    from dflash_core.errors import ConfigError

    model = Target.from_pretrained(wide_target_dir, dtype=torch.bfloat16).model
    with pytest.raises(ConfigError, match="a batch-invariant target compiles with library GEMMs"):
        Target(model, static_cache=True, compiled=True, compile_gemms="template")
    monkeypatch.setattr(cpu_attention, "row_invariant_ready", lambda: False)
    with pytest.raises(ConfigError, match="Compiled steps cannot run this target: a batch-invariant target's "
                                          "compiled steps attend through the masked-attention kernel"):
        Target(model, static_cache=True, compiled=True)


class RoundsBlocksDifferently(torch.nn.Linear):
    """Stands in for a kernel whose reduction order depends on how many rows it is given."""

    def forward(self, x):
        y = super().forward(x)
        return y + 2**-6 if x.shape[-2] > 1 else y


def test_a_linear_that_rounds_blocks_differently_runs_rows_alone(wide_target_dir):
    # Loaded without batch invariance: which real layers the probe sends row by row depends on the
    # CPU class (on AVX2-only CPUs all of them), and a layer already split would hide the fault.
    target = Target.from_pretrained(wide_target_dir, dtype=torch.bfloat16, batch_invariant=False)
    target.tap_layers([1])
    faulty = target.model.model.layers[1].mlp.up_proj
    faulty.__class__ = RoundsBlocksDifferently
    assert rows_alone_from(faulty) == 2  # what the probe is there to catch
    ids = torch.randint(0, target.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
    assert "model.layers.1.mlp.up_proj" in make_batch_invariant(target.model)
    (block, _), (steps, _) = block_and_steps(target, ids, 12)
    assert torch.equal(block, steps)


@pytest.mark.parametrize("in_features, out_features", [(576, 1536), (1536, 576), (576, 576)])
def test_smollm2_linear_shapes_compute_every_block_row_as_alone(in_features, out_features):
    layer = torch.nn.Sequential(torch.nn.Linear(in_features, out_features, bias=False)).bfloat16()
    pack_linears(layer)
    linear = layer[0]
    linear.rows_limit = MAX_BLOCK  # as make_batch_invariant sets it
    if (from_rows := rows_alone_from(linear)) is not None:
        run_rows_alone(linear, from_rows)
    x = torch.randn(1, MAX_BLOCK, in_features, generator=torch.Generator().manual_seed(1)).bfloat16()
    with torch.inference_mode():
        alone = torch.cat([linear(x[:, i : i + 1]) for i in range(MAX_BLOCK)], dim=1)
        for rows in range(2, MAX_BLOCK + 1):
            assert torch.equal(linear(x[:, :rows]), alone[:, :rows]), rows


def test_prefills_keep_one_call_only_blocks_split():
    linear, calls = torch.nn.Linear(8, 8), []
    whole = linear.forward
    linear.forward = lambda x: calls.append(x.shape[-2]) or whole(x)
    run_rows_alone(linear)
    linear(torch.randn(1, 4, 8))
    assert calls == [1, 1, 1, 1]
    calls.clear()
    linear(torch.randn(1, MAX_BLOCK + 1, 8))  # a prefill: plain decoding and DFlash run it alike
    assert calls == [MAX_BLOCK + 1]

    # A kernel exact up to 16 rows keeps those blocks in one call and splits the longer ones.
    linear, calls = torch.nn.Linear(8, 8), []
    whole = linear.forward
    linear.forward = lambda x: calls.append(x.shape[-2]) or whole(x)
    run_rows_alone(linear, from_rows=17)
    linear(torch.randn(1, 16, 8))
    linear(torch.randn(1, 18, 8))
    assert calls == [16] + [1] * 18

    base, wrapped = ALL_ATTENTION_FUNCTIONS["sdpa"], ALL_ATTENTION_FUNCTIONS[register("sdpa")]

    class Module(torch.nn.Module):
        num_key_value_groups, is_causal = 1, True

    n, past = MAX_BLOCK + 1, 3
    q, k, v = torch.randn(1, 2, n, 8), torch.randn(1, 2, n + past, 8), torch.randn(1, 2, n + past, 8)
    causal = torch.ones(1, 1, n, n + past, dtype=torch.bool).tril(past)
    assert torch.equal(wrapped(Module(), q, k, v, causal)[0], base(Module(), q, k, v, causal)[0])


def test_rows_alone_layers_are_named_in_the_status(wide_target_dir):
    target = Target.from_pretrained(wide_target_dir, dtype=torch.bfloat16)
    before = rows_alone_layers(target.model)  # the probe's verdicts: they depend on the CPU class
    if "lm_head" not in before:
        run_rows_alone(target.model.lm_head)
    names = rows_alone_layers(target.model)
    assert set(names) == set(before) | {"lm_head"}
    assert describe(target.model).endswith(f"({len(names)} linear layers row by row)")


def test_auto_dtype_is_bf16_only_where_it_stays_lossless_and_fast(monkeypatch):
    from dflash_core.loading import pair

    monkeypatch.setattr(pair, "_cpu_flags", lambda: "flags : avx512f avx512_bf16 amx_bf16 amx_tile")
    assert pair.parse_dtype("auto", "cpu") == torch.bfloat16
    assert pair.parse_dtype("auto", "cuda") == torch.bfloat16  # what the released pairs were made for
    monkeypatch.setattr(pair, "_cpu_flags", lambda: "flags : avx512f avx512_bf16")
    assert pair.parse_dtype("auto", "cpu") == torch.bfloat16  # native bf16 dot products, no AMX
    assert pair.has_fast_bf16("cpu")
    monkeypatch.setattr(pair, "_cpu_flags", lambda: "flags : avx2")
    assert pair.parse_dtype("auto", "cpu") == torch.float32  # emulated bf16 would be slow
    assert not pair.has_fast_bf16("cpu")
    with pytest.raises(ValueError, match="choose one of float32, bfloat16, float16 or auto"):
        pair.parse_dtype("bf16")


def test_app_status_names_the_target_numerics(tiny_dirs):
    from app.pairs.models import PairCache
    from app.pairs.registry import cli_pair
    from app.ui import App
    from dflash_core.loading import pair

    for dtype, expected in (("bfloat16", "bfloat16, blocks verified bitwise as one-token steps"), ("float32", "float32;")):
        spec = cli_pair(*map(str, tiny_dirs), dtype=dtype)
        *_, (status, _) = App([spec], spec.id, PairCache("cpu")).loading.load_selected(spec.id)
        assert f"target in {expected}" in status, status
        drafter_dtype = str(pair.default_drafter_dtype("cpu", pair.parse_dtype(dtype))).removeprefix("torch.")
        assert f"drafter in {drafter_dtype}, trained with block size" in status, status
