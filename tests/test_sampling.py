"""Exactness of sampling: acceptance rules against hand-computed probabilities, and the
distribution of every method's output (DFlash, the autoregressive drafter, prompt lookup) against
the target's exact distribution (chi-square)."""

import itertools

import pytest
import torch
from scipy.stats import chi2
from tiny import build_drafter, build_target

from dflash_core import DFlashDrafter, PromptLookup, SamplingParams, Target, run
from dflash_core.errors import GenerationInputError
from dflash_core.sampling import greedy_ids, probabilities
from dflash_core.schedule import CostProfile
from dflash_core.verify import greedy_accept, match_sampled_accept, rejection_accept


def chi_square_ok(counts: torch.Tensor, probs: torch.Tensor, alpha=1e-3) -> bool:
    n = counts.sum()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token the target can never emit was emitted"
    expected = probs[keep] * n
    stat = ((counts[keep] - expected) ** 2 / expected).sum().item()
    return stat < chi2.ppf(1 - alpha, int(keep.sum()) - 1)


def test_greedy_accept_hand_case():
    logits = torch.full((4, 10), -1.0)
    for slot, token in enumerate([1, 2, 5, 7]):
        logits[slot, token] = 3.0
    assert greedy_accept(torch.tensor([1, 2, 3]), logits).tolist() == [2, 5]
    assert greedy_accept(torch.tensor([1, 2, 5]), logits).tolist() == [3, 7]
    assert greedy_accept(torch.tensor([4, 2, 5]), logits).tolist() == [0, 1]


def test_probabilities_temperature_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(probabilities(logits, SamplingParams(1.0)), torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(probabilities(logits, SamplingParams(1.0, top_k=2)), torch.tensor([[0.625, 0.375, 0, 0]]))
    # top_p 0.8: 0.5 + 0.3 reaches 0.8, so 0.15 and 0.05 go.
    assert torch.allclose(probabilities(logits, SamplingParams(1.0, top_p=0.8)), torch.tensor([[0.625, 0.375, 0, 0]]))
    assert torch.allclose(probabilities(logits, SamplingParams(1.0, top_p=0.81)), torch.tensor([[0.5, 0.3, 0.15, 0]]) / 0.95)
    sharp = probabilities(logits, SamplingParams(0.5))
    assert torch.allclose(sharp, torch.tensor([[0.25, 0.09, 0.0225, 0.0025]]) / 0.365)


def test_rejection_rule_keeps_with_probability_min_1_p_over_q_and_outputs_p():
    """One draft slot: p = [.5, .3, .2], q = [.2, .5, .3]. Token 1 is kept with probability .6,
    token 2 with .2/.3, token 0 always; the emitted token must follow p exactly."""
    p = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.2, 0.5, 0.3]])
    gen = torch.Generator().manual_seed(0)
    n = 30000
    kept = torch.zeros(3)
    drawn = torch.zeros(3)
    out = torch.zeros(3)
    for _ in range(n):
        x = torch.multinomial(q[0], 1, generator=gen)
        accepted, bonus = rejection_accept(x, q, p, gen).tolist()
        drawn[x] += 1
        kept[x] += accepted
        out[x.item() if accepted else bonus] += 1
    assert torch.allclose(kept / drawn, torch.tensor([1.0, 0.6, 2 / 3]), atol=0.02)
    assert chi_square_ok(out, p[0])


def test_match_rule_outputs_target_distribution():
    """Deterministic draft [1]: the first token must follow p[0] and, when the draft was kept,
    the bonus must follow p[1]."""
    p = torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
    gen = torch.Generator().manual_seed(1)
    first = torch.zeros(3)
    after_keep = torch.zeros(3)
    for _ in range(20000):
        accepted, bonus = match_sampled_accept(torch.tensor([1]), p, gen).tolist()
        first[1 if accepted else bonus] += 1
        if accepted:
            after_keep[bonus] += 1
    assert chi_square_ok(first, p[0])
    assert chi_square_ok(after_keep, p[1])


@pytest.fixture(scope="module")
def tiny_vocab_pair(tmp_path_factory):
    """A 4-token target and drafters for it: `pair(None)` proposes any id, `pair((3, 1))` only
    ids 3 and 1 (zero draft mass on 0 and 2, which the rejection rule must still get right)."""
    root = tmp_path_factory.mktemp("vocab4")
    target_dir = build_target(root / "target", vocab_size=4, logit_scale=1.0, hidden=16, num_layers=2, seed=3)
    target, drafters = Target.from_pretrained(target_dir), {}

    def pair(draft_vocab, method="dflash"):
        key = (draft_vocab, method)
        if key not in drafters:
            if method == "lookup":
                drafters[key] = PromptLookup(block_size=4)
            else:
                extra = {"architectures": ["DFlashARDraftModel"]} if method == "ar" else {}
                d = build_drafter(root / f"drafter-{draft_vocab}-{method}", target_dir, num_layers=1, block_size=4,
                                  seed=4, draft_vocab=None if draft_vocab is None else list(draft_vocab), **extra)
                drafters[key] = DFlashDrafter.from_pretrained(d)
        return target, drafters[key]

    return pair


def exact_joint(target: Target, prompt, length, params) -> torch.Tensor:
    """P(first `length` generated tokens) under the target alone, by enumeration."""
    vocab = target.vocab_size
    joint = torch.zeros([vocab] * length)
    with torch.no_grad():
        for seq in itertools.product(range(vocab), repeat=length):
            ids = torch.tensor([prompt + list(seq[:-1])])
            logits = target.model(input_ids=ids).logits[0, len(prompt) - 1 :]
            probs = probabilities(logits, params)
            joint[seq] = torch.prod(torch.stack([probs[i, t] for i, t in enumerate(seq)]))
    return joint


# Runs per end-to-end chi-square test. At alpha 1e-3 over the 27 possible outputs (26 degrees of
# freedom), 800 runs detect a deviation of Cohen's w >= 0.3 with power 0.997 (noncentral chi-square,
# lambda = n w^2). Two broken engines, measured on this pair over 3,000 runs: a rejection rule that
# resamples from p instead of the residual max(0, p - q) gives w ~ 0.51; one that keeps every draft
# gives w ~ 0.61 (`dev/scripts/chi_square_power.py`).
CHI_SQUARE_RUNS = 800


def assert_samples_follow_the_target(target, drafter):
    """`drafter`'s sampled 3-token outputs after [1, 2, 0] (temperature 1.3, top-k 3) follow the target's
    exact distribution (chi-square), with drafts often accepted."""
    prompt, length = [1, 2, 0], 3
    exact = exact_joint(target, prompt, length, SamplingParams(temperature=1.3, top_k=3)).flatten()
    counts, accepted = torch.zeros_like(exact), 0
    for seed in range(CHI_SQUARE_RUNS):
        out = run(target, prompt, drafter, max_new_tokens=length, sampling=SamplingParams(1.3, top_k=3, seed=seed))
        a, b, c = out.output_ids
        counts[a * 16 + b * 4 + c] += 1
        accepted += sum(blk.accepted for blk in out.blocks)
    assert accepted > CHI_SQUARE_RUNS // 5, "drafts were rarely accepted: the test would not exercise the acceptance rule"
    assert chi_square_ok(counts, exact)


@pytest.mark.slow
@pytest.mark.parametrize("method,draft_vocab,draft_mode", [
    ("dflash", None, "argmax"), ("dflash", None, "sample"), ("dflash", (3, 1), "sample"),
    # The autoregressive drafter's q is conditioned on its own sampled drafts; prompt lookup's is a point mass.
    ("ar", None, "sample"), ("ar", None, "argmax"), ("ar", (3, 1), "sample"), ("lookup", None, "sample"),
])
def test_sampling_matches_exact_target_distribution(tiny_vocab_pair, method, draft_vocab, draft_mode):
    target, drafter = tiny_vocab_pair(draft_vocab, method)
    prompt, length = [1, 2, 0], 3
    params = SamplingParams(temperature=1.3, top_k=3)
    exact = exact_joint(target, prompt, length, params).flatten()
    assert abs(exact.sum().item() - 1) < 1e-5
    counts = torch.zeros_like(exact)
    accepted = 0
    for seed in range(CHI_SQUARE_RUNS):
        out = run(
            target, prompt, drafter, max_new_tokens=length, block_size=4,
            sampling=SamplingParams(1.3, top_k=3, seed=seed), draft_mode=draft_mode,
        )
        a, b, c = out.output_ids
        counts[a * 16 + b * 4 + c] += 1
        accepted += sum(blk.accepted for blk in out.blocks)
        if getattr(drafter, "draft_vocab", None) is not None:
            assert {t for blk in out.blocks for t in blk.draft_ids} <= set(drafter.draft_vocab.tolist())
    assert accepted > CHI_SQUARE_RUNS // 5, "drafts were rarely accepted: the test would not exercise the acceptance rule"
    assert chi_square_ok(counts, exact)


@pytest.mark.slow
@pytest.mark.parametrize("method,draft_vocab,draft_mode", [
    ("dflash", None, "sample"), ("ar", None, "argmax"),
])
def test_the_block_schedule_keeps_the_exact_target_distribution(tiny_vocab_pair, method, draft_vocab, draft_mode):
    """block_size="auto" verifies a prefix of each draft, its length chosen from the drafter's q and the
    cost profile: still exact. The profiles (a draft costing 0 to 0.36 of a step) put the choice at
    every length from 0 drafts to all, and near the drafts' confidences (about 1/3 here), where q decides;
    a cycle that chose no draft pauses the drafter for the next, whose token is then a plain step's."""
    target, drafter = tiny_vocab_pair(draft_vocab, method)
    prompt, length = [1, 2, 0], 3
    params = SamplingParams(temperature=1.3, top_k=3)
    exact = exact_joint(target, prompt, length, params).flatten()
    counts, accepted, lengths, paused = torch.zeros_like(exact), 0, set(), 0
    for seed in range(CHI_SQUARE_RUNS):
        step = (0.0, 0.32, 0.35, 0.36)[seed % 4]
        costs = CostProfile(tuple(1 + step * k for k in range(4)))
        out = run(target, prompt, drafter, max_new_tokens=length, block_size="auto", costs=costs,
                  sampling=SamplingParams(1.3, top_k=3, seed=seed), draft_mode=draft_mode)
        a, b, c = out.output_ids
        counts[a * 16 + b * 4 + c] += 1
        accepted += sum(blk.accepted for blk in out.blocks)
        lengths |= {blk.verify_len for blk in out.blocks}
        paused += sum(not blk.draft_ids for blk in out.blocks)
    assert accepted > CHI_SQUARE_RUNS // 5, "drafts were rarely accepted: the test would not exercise the acceptance rule"
    assert len(lengths) > 1, f"every cycle verified {lengths} tokens: the test would not exercise the schedule"
    assert paused > CHI_SQUARE_RUNS // 20, f"{paused} paused cycles: the test would not exercise the drafter's pauses"
    assert chi_square_ok(counts, exact)


def test_bad_sampling_parameters_are_named():
    with pytest.raises(GenerationInputError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(GenerationInputError, match="top_p"):
        SamplingParams(temperature=1, top_p=0)
    with pytest.raises(GenerationInputError, match="top_k"):
        SamplingParams(temperature=1, top_k=-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_greedy_ids_pick_the_first_of_tied_maxima_as_argmax_does(dtype):
    """Every greedy choice of the engine goes through `greedy_ids`: plain decoding's and a verify's
    must break ties alike, which is argmax's rule (the first maximal index)."""
    gen = torch.Generator().manual_seed(0)
    for rows, vocab in [(1, 49152), (4, 49152), (9, 151936), (3, 37)]:
        scores = (torch.randn(rows, vocab, generator=gen) * 3).round().to(dtype)  # many ties below the top
        top = scores.max()
        scores[:, torch.randint(0, vocab, (6,), generator=gen)] = top + 1  # six tied maxima per row
        ids = greedy_ids(scores)
        assert torch.equal(ids, scores.argmax(dim=-1))
        assert all((row == top + 1).nonzero()[0, 0] == i for row, i in zip(scores, ids))
    assert greedy_ids(torch.zeros(50, dtype=dtype)) == 0  # one row, all tied
