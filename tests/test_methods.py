"""One drafter interface: DFlash, the autoregressive drafter and prompt lookup through the same
`generate`, each token-identical to plain decoding at T=0, with the drafter passes per Block."""

from __future__ import annotations

import pytest
import torch
from test_decoding import random_prompts
from tiny import build_drafter

from dflash_core import DFlashDrafter, PromptLookup, run
from dflash_core.errors import GenerationInputError
from dflash_core.models.drafter import method_name
from dflash_core.prompt_lookup import lookup
from dflash_core.training.objective import DrafterTrainer, default_gamma

METHODS = ["dflash", "ar", "lookup"]


@pytest.fixture(scope="module")
def drafters(tiny_dirs, tmp_path_factory):
    """Each method's drafter for the tiny target, block size 4."""
    target_dir, drafter_dir = tiny_dirs
    ar_dir = build_drafter(tmp_path_factory.mktemp("ar") / "ar", target_dir, block_size=4,
                           architectures=["DFlashARDraftModel"])
    return {
        "dflash": DFlashDrafter.from_pretrained(drafter_dir),
        "ar": DFlashDrafter.from_pretrained(ar_dir),
        "lookup": PromptLookup(block_size=4),
    }


@pytest.mark.parametrize("method", METHODS)
def test_every_method_is_token_identical_to_plain(tiny_pair, drafters, method, one_thread):
    target, _ = tiny_pair
    drafter = drafters[method]
    for prompt in random_prompts(target.vocab_size, 3, seed=5):
        plain = run(target, prompt, max_new_tokens=24)
        fast = run(target, prompt, drafter, max_new_tokens=24, block_size=4)
        assert fast.output_ids == plain.output_ids
        assert fast.method == method and plain.method == "plain"
        passes = {b.draft_passes for b in fast.blocks}
        assert passes == {"dflash": {1}, "ar": {3}, "lookup": {0}}[method]
        assert all(len(b.draft_ids) <= 3 for b in fast.blocks)
        assert all(b.draft_passes == 0 and b.draft_ids == () for b in plain.blocks)


def test_ar_drafter_passes_compute_what_training_does(tiny_pair, drafters, one_thread):
    """The γ causal passes with their cache reproduce the teacher-forced training forward whenever
    the drafts are the data's tokens: the cache holds exactly the tokens each pass should see."""
    target, _ = tiny_pair
    drafter = drafters["ar"]
    prompt = random_prompts(target.vocab_size, 1, seed=9)[0]
    summary = run(target, prompt, drafter, max_new_tokens=30, block_size=4)
    seq = torch.tensor([*prompt, *summary.output_ids])
    trainer = DrafterTrainer(target, drafter, 4, default_gamma(4))
    with torch.no_grad():
        out = trainer.forward(seq, torch.tensor([b.position for b in summary.blocks if b.position + 3 < len(seq)]),
                              dense=True)
    greedy = out.logits.argmax(-1)
    for j, block in enumerate(b for b in summary.blocks if b.position + 3 < len(seq)):
        # Slot k's draft follows from the drafts before it; teacher forcing agrees up to the first miss.
        k = block.accepted + 1 if block.accepted < 3 else 3
        assert list(block.draft_ids[:k]) == greedy[j, :k].tolist()


def test_prompt_lookup_copies_the_latest_longest_match():
    context = [5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 5, 6, 7]
    assert lookup(context, (3, 2, 1), 3) == [2, 3, 5]  # the latest 5 6 7, not the first
    assert lookup(context, (2,), 5) == [2, 3, 5, 6, 7]
    assert lookup([1, 2, 3, 4], (2, 1), 3) == []  # nothing repeats: no draft
    assert lookup([4, 1, 2, 4], (2, 1), 3) == [1, 2, 4]  # falls back to the shorter n-gram
    assert lookup([1, 2, 1, 2], (2,), 3) == [1, 2]  # fewer tokens when the match is near the end
    assert lookup([7, 7, 7, 7, 7], (2,), 3) == [7, 7, 7]  # a full continuation beats the latest match
    assert PromptLookup(ngram_sizes=(1, 3, 2)).ngram_sizes == (3, 2, 1)


@pytest.mark.parametrize("bad", [{"block_size": 1}, {"ngram_sizes": ()}, {"ngram_sizes": (0,)}, {"ngram_sizes": (2.5,)}])
def test_prompt_lookup_rejects_bad_settings(bad):
    with pytest.raises(GenerationInputError, match="block_size|ngram_sizes"):
        PromptLookup(**bad)


def test_prompt_lookup_wins_on_repeated_text(tiny_pair, one_thread):
    """When the output repeats the context, copying is accepted far more often than not at all."""
    target, _ = tiny_pair
    prompt = random_prompts(target.vocab_size, 1, seed=3)[0]
    first = list(run(target, prompt, max_new_tokens=40).output_ids)
    # The same prompt and answer once more: the target's answer after it is a copy of the text before.
    repeated = [*prompt, *first, *prompt]
    plain = run(target, repeated, max_new_tokens=40)
    copied = run(target, repeated, PromptLookup(block_size=4), max_new_tokens=40)
    assert copied.output_ids == plain.output_ids
    assert copied.tau > 2.5 and len(copied.blocks) < len(plain.blocks) / 2


def test_method_names():
    assert method_name(None) == "plain" and method_name(PromptLookup()) == "lookup"
