"""A static, preallocated target KV cache decodes token for token as the dynamic one does."""

from __future__ import annotations

import pytest

from dflash_core import SamplingParams, Target, run


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=4)])
def test_static_cache_equals_dynamic_cache(golden_dir, golden_pair, golden_expected, sampling):
    dynamic, drafter = golden_pair
    static = Target(dynamic.model, static_cache=True)  # same weights, a StaticCache of its own
    for prompt in golden_expected["prompts"]:
        for block_size in (8, 4, None):
            kwargs = dict(max_new_tokens=40, block_size=block_size, sampling=sampling)
            a = run(dynamic, prompt["prompt_ids"], drafter if block_size else None, **kwargs)
            b = run(static, prompt["prompt_ids"], drafter if block_size else None, **kwargs)
            assert b.output_ids == a.output_ids and b.acceptance_lengths == a.acceptance_lengths
            assert [x.draft_ids for x in b.blocks] == [x.draft_ids for x in a.blocks]
    # Runs reuse the preallocated buffers; a longer run grows them.
    buffers = static.cache
    run(static, [1, 2, 3], max_new_tokens=4)
    assert static.cache is buffers and static.cache_length == 3 + 4 - 1
    run(static, [1, 2, 3], max_new_tokens=300)
    assert static.cache is not buffers


def test_static_cache_is_a_switch_of_from_pretrained(golden_dir):
    target = Target.from_pretrained(golden_dir / "target", static_cache=True)
    golden = Target.from_pretrained(golden_dir / "target")
    assert run(target, [5, 6, 7], max_new_tokens=12).output_ids == run(golden, [5, 6, 7], max_new_tokens=12).output_ids
