"""Decoding loop behaviour: lossless at temperature 0, exact limits and stops, cache rollback."""

import random

import pytest

from dflash_core import Block, Prefill, SamplingParams, Summary, generate, run


def random_prompts(vocab, n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(vocab - 1) for _ in range(rng.randint(1, 12))] for _ in range(n)]


@pytest.mark.parametrize("block_size", [2, 3, 5, 8])
def test_greedy_dflash_is_token_identical_to_plain(golden_pair, golden_expected, block_size):
    target, drafter = golden_pair
    # Prompts the drafter knows (golden prompts continued by k reference tokens) so drafts get
    # accepted in part, plus random ones where they mostly do not.
    known = [p["prompt_ids"] + p["target_greedy_ids"][:k] for p in golden_expected["prompts"] for k in (0, 3, 10)]
    accepted_any = False
    for prompt in known[block_size % 3 :: 3] + random_prompts(512, 2, seed=block_size):
        plain = run(target, prompt, max_new_tokens=32)
        fast = run(target, prompt, drafter, max_new_tokens=32, block_size=block_size)
        assert fast.output_ids == plain.output_ids
        accepted_any |= any(b.accepted for b in fast.blocks)
    assert accepted_any, "the drafter never agreed with the target: the test would not exercise acceptance"


def test_tiny_llama_pair_is_lossless(tiny_pair, tiny_dirs):
    target, drafter = tiny_pair
    for prompt in random_prompts(target.vocab_size, 3):
        for block_size in (1, 4, 8):
            fast = run(target, prompt, drafter, max_new_tokens=20, block_size=block_size)
            assert fast.output_ids == run(target, prompt, max_new_tokens=20).output_ids


def test_events_and_cache_rollback_after_partial_acceptance(golden_pair, golden_expected):
    target, drafter = golden_pair
    prompt = golden_expected["prompts"][0]["prompt_ids"]
    events = generate(target, prompt, drafter, max_new_tokens=40, block_size=8)
    assert isinstance(next(events), Prefill)
    partial = 0
    committed = 1
    for event in events:
        if isinstance(event, Summary):
            break
        assert isinstance(event, Block)
        assert len(event.draft_ids) == 7 and 0 <= event.accepted <= 7
        end = event.position + event.accepted + 1
        # Only the accepted positions stay cached; the new bonus is fed as the next block's slot 0.
        assert target.cache_length == end
        assert event.committed_ids[: event.accepted] == event.draft_ids[: event.accepted][: len(event.committed_ids)]
        partial += 0 < event.accepted < 7
        committed += len(event.committed_ids)
    assert partial > 0
    assert committed == len(event.output_ids) == 40
    assert event.tau == sum(event.acceptance_lengths) / len(event.blocks)
    assert sum(event.acceptance_histogram) == len(event.blocks)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 33])
def test_max_new_tokens_is_exact(golden_pair, max_new_tokens):
    target, drafter = golden_pair
    prompt = [5, 6, 7]
    fast = run(target, prompt, drafter, max_new_tokens=max_new_tokens)
    assert len(fast.output_ids) == max_new_tokens
    assert fast.output_ids == run(target, prompt, max_new_tokens=max_new_tokens).output_ids


def test_stop_token_ends_output_and_nothing_follows(golden_pair, golden_expected):
    target, drafter = golden_pair
    prompt = golden_expected["prompts"][1]
    reference = prompt["target_greedy_ids"]
    stop = reference[17]
    cut = reference.index(stop)
    for d in (None, drafter):
        out = run(target, prompt["prompt_ids"], d, max_new_tokens=40, stop_ids=[stop])
        assert list(out.output_ids) == reference[: cut + 1]
        assert out.stop_reason == "stop_token"


def test_generated_mask_token_is_kept(golden_pair, golden_expected):
    """A real token equal to the mask id must be emitted, not stripped (a known bug elsewhere)."""
    target, drafter = golden_pair
    prompt = golden_expected["prompts"][0]
    reference = prompt["target_greedy_ids"]
    original = drafter.config.mask_token_id
    drafter.config.mask_token_id = reference[5]
    try:
        out = run(target, prompt["prompt_ids"], drafter, max_new_tokens=40)
    finally:
        drafter.config.mask_token_id = original
    assert list(out.output_ids) == reference
    assert reference[5] in out.output_ids


def test_sampling_is_reproducible_with_a_seed(golden_pair):
    target, drafter = golden_pair
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=123)
    a = run(target, [1, 2, 3], drafter, max_new_tokens=24, sampling=params)
    b = run(target, [1, 2, 3], drafter, max_new_tokens=24, sampling=params)
    c = run(target, [1, 2, 3], drafter, max_new_tokens=24, sampling=SamplingParams(temperature=0.8, top_p=0.9, seed=7))
    assert a.output_ids == b.output_ids
    assert a.output_ids != c.output_ids


def test_plain_decoding_yields_one_token_blocks(tiny_pair):
    target, _ = tiny_pair
    events = list(generate(target, [3, 4, 5], max_new_tokens=6))
    blocks = [e for e in events if isinstance(e, Block)]
    assert len(blocks) == 5 and all(b.draft_ids == () and len(b.committed_ids) == 1 for b in blocks)
    assert events[-1].tau == 1.0 and events[-1].block_size == 1


def test_clocks_count_compute_not_time_suspended(golden_pair):
    """A consumer that pauses between events (the app's race) must not slow the run down on paper."""
    import time

    target, drafter = golden_pair
    events = generate(target, [1, 2, 3], drafter, max_new_tokens=6)
    start, slept = time.perf_counter(), 0.0
    for event in events:
        if not hasattr(event, "output_ids"):
            time.sleep(0.05)
            slept += 0.05
    wall = time.perf_counter() - start
    # Whatever the machine's load, the run's clock must leave out every pause (0.35 s here).
    assert event.total_s <= wall - slept + 0.01
    assert event.blocks[-1].elapsed_s <= event.total_s
