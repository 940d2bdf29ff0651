"""The opt-in cycle explanation: equal to an independent recomputation, and free of side effects.

Recomputations run the models again from scratch (no cache) in float32, so they differ from the
incremental decoding only by rounding: probabilities are compared with an absolute tolerance of 1e-4.
"""

import pytest
import torch
from tiny import build_drafter

from dflash_core import DFlashDrafter, SamplingParams, run
from dflash_core.errors import GenerationInputError
from dflash_core.events import CacheLengths, Injected
from dflash_core.explain import distribution

TOL = 1e-4
SETTINGS = [
    ("greedy", SamplingParams(), "sample"),
    ("rejection", SamplingParams(temperature=0.8, seed=3), "sample"),
    ("match", SamplingParams(temperature=0.8, top_p=0.9, seed=5), "argmax"),
]


def prompt_of(golden_expected, i=0):
    return golden_expected["prompts"][i]["prompt_ids"]


def assert_topk_matches(recorded, probs):
    """`recorded` [[id, p], ...] is the top of `probs` [V]: same values in order, each id's own p."""
    values = torch.topk(probs, len(recorded)).values.tolist()
    assert [p for _, p in recorded] == pytest.approx(values, abs=TOL)
    for token, p in recorded:
        assert probs[token].item() == pytest.approx(p, abs=TOL)


@pytest.mark.parametrize("rule, sampling, mode", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_explain_changes_nothing_in_the_output(golden_pair, golden_expected, rule, sampling, mode):
    target, drafter = golden_pair
    for prompt_index in (0, 1):
        prompt = prompt_of(golden_expected, prompt_index)
        for d in (drafter, None):
            kwargs = dict(max_new_tokens=40, block_size=8, sampling=sampling, draft_mode=mode)
            off = run(target, prompt, d, **kwargs)
            on = run(target, prompt, d, explain=5, **kwargs)
            assert on.output_ids == off.output_ids
            assert on.acceptance_lengths == off.acceptance_lengths
            assert [b.draft_ids for b in on.blocks] == [b.draft_ids for b in off.blocks]
            assert all(b.explain is None for b in off.blocks)
            expected = rule if d is not None or rule == "greedy" else "match"  # plain: the target's own sample
            assert all(b.explain.decision.rule == expected for b in on.blocks)


@pytest.mark.parametrize("rule, sampling, mode", SETTINGS, ids=[s[0] for s in SETTINGS])
@torch.inference_mode()
def test_explain_equals_a_recomputation(golden_pair, golden_expected, rule, sampling, mode):
    target, drafter = golden_pair
    prompt = prompt_of(golden_expected)
    k = 4
    summary = run(target, prompt, drafter, max_new_tokens=40, block_size=8, sampling=sampling, draft_mode=mode, explain=k)
    assert any(0 < b.accepted < 7 for b in summary.blocks), "no partial acceptance: the test would not exercise it"
    sequence = prompt + list(summary.output_ids)

    # One target forward over the final sequence, with the drafter's layers tapped for its context.
    target.reset()
    target.tap_layers(drafter.target_layer_ids)
    full_logits, features = target.forward(torch.tensor([sequence]))
    checked_rows = 0
    for block in summary.blocks:
        info = block.explain
        B = len(block.draft_ids) + 1
        assert info.positions == tuple(range(block.position, block.position + B))
        assert info.slot0_id == sequence[block.position]
        assert info.mask_id == drafter.mask_token_id
        assert list(info.injected.target_layers) == drafter.target_layer_ids
        assert info.cache == CacheLengths(
            target_before=block.position,
            target_after=block.position + block.accepted + 1,
            drafter_before=block.position - info.injected.positions,
            drafter_after=block.position,
        )
        assert len(info.draft_topk) == B - 1 and len(info.target_topk) == B
        assert all(len(row) == k for row in info.draft_topk + info.target_topk)
        assert min(info.time.draft_s, info.time.verify_s, info.time.other_s) >= 0

        # Target: rows whose inputs were all committed are rows of the final sequence's forward.
        for i in range(block.accepted + 1):
            if block.position + i < len(sequence):
                expected = distribution(full_logits[block.position + i][None], sampling)[0]
                assert_topk_matches(info.target_topk[i], expected)
                checked_rows += 1
        # Every row (rejected drafts too): a fresh forward over the committed prefix and the block.
        target.reset()
        block_ids = [info.slot0_id, *block.draft_ids]
        logits, _ = target.forward(torch.tensor([sequence[: block.position] + block_ids]))
        for i, row in enumerate(info.target_topk):
            assert_topk_matches(row, distribution(logits[block.position + i][None], sampling)[0])

        # Drafter: one uncached call on the recorded block, with the committed context before it.
        noisy = torch.tensor([[info.slot0_id] + [info.mask_id] * (B - 1)])
        positions = torch.tensor([list(range(block.position)) + list(info.positions)])
        hidden = drafter(target.embed(noisy), features[:, : block.position], positions, cache=drafter.new_cache())
        draft_logits = drafter.full_logits(drafter.draft_logits(hidden[0, 1:], target.head), target.vocab_size)
        draft_probs = distribution(draft_logits, sampling)
        for slot, row in enumerate(info.draft_topk):
            assert_topk_matches(row, draft_probs[slot])

        # The decision, slot by slot, up to and including the first rejected draft.
        slots = info.decision.slots
        assert [s.slot for s in slots] == list(range(1, min(block.accepted + 1, B - 1) + 1))
        assert [s.accepted for s in slots] == [i < block.accepted for i in range(len(slots))]
        assert [s.draft for s in slots] == list(block.draft_ids[: len(slots)])
        for i, s in enumerate(slots):
            p = distribution(logits[block.position + i][None], sampling)[0, s.draft].item()
            assert s.p == pytest.approx(p, abs=TOL)
            assert s.q == pytest.approx(draft_probs[i, s.draft].item(), abs=TOL)
            if rule == "greedy":
                assert s.target == int(logits[block.position + i].argmax())
                assert s.accepted == (s.draft == s.target)
            elif rule == "match":
                assert s.accepted == (s.draft == s.target)
            else:
                assert s.accepted == (s.u * s.q < s.p)
                assert s.ratio == pytest.approx(s.p / s.q)
                assert s.target == (None if s.accepted else block.bonus_id)
        assert info.decision.resampled == (rule == "rejection" and block.accepted < B - 1)
    assert checked_rows > len(summary.blocks)


def test_plain_decoding_explains_the_target_only(golden_pair, golden_expected):
    target, _ = golden_pair
    summary = run(target, prompt_of(golden_expected), None, max_new_tokens=6, explain=3)
    for block in summary.blocks:
        info = block.explain
        assert info.mask_id is None and info.draft_topk == () and info.decision.slots == ()
        assert info.target_topk[0][0][0] == block.bonus_id  # greedy: the top token is the one emitted
        assert info.injected == Injected(positions=0, target_layers=())


@pytest.mark.parametrize("bad", [-1, 1.5, True, "5"])
def test_explain_must_be_a_top_k_size(golden_pair, golden_expected, bad):
    target, drafter = golden_pair
    with pytest.raises(GenerationInputError, match=f"explain must be 0 \\(off\\) or a top-k size >= 1, got {bad!r}"):
        run(target, prompt_of(golden_expected), drafter, max_new_tokens=4, explain=bad)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, seed=2)], ids=["greedy", "sampled"])
def test_a_draft_vocabulary_is_explained_in_target_ids(tmp_path, tiny_dirs, tiny_pair, sampling):
    """The drafter's top-k names target ids from its vocabulary, and a greedy draft is its top-1."""
    target_dir, _ = tiny_dirs
    target, _ = tiny_pair
    vocab = list(range(target.vocab_size - 2, 3, -7))
    drafter = DFlashDrafter.from_pretrained(build_drafter(tmp_path / "d", target_dir, draft_vocab=vocab))
    summary = run(target, [5, 9, 11], drafter, max_new_tokens=16, block_size=4, sampling=sampling, explain=3)
    for block in summary.blocks:
        rows = block.explain.draft_topk
        assert {t for row in rows for t, _ in row} <= set(vocab)
        if sampling.greedy:
            assert [row[0][0] for row in rows] == list(block.draft_ids)


def test_exact_ties_list_the_decided_token_first():
    from dflash_core.explain import _topk_lists

    probs = torch.tensor([[0.1, 0.3, 0.3, 0.3], [0.4, 0.2, 0.2, 0.2], [0.1, 0.2, 0.3, 0.4]])
    listed = torch.topk(probs[0], 2).indices.tolist()
    unlisted = ({1, 2, 3} - set(listed)).pop()  # tied with the top, left out by topk
    second = torch.topk(probs[1], 2).indices.tolist()[1]
    tied_below = ({1, 2, 3} - {second}).pop()  # tied with the second, not the one topk picked
    rows = _topk_lists(probs, 2, [unlisted, tied_below, None])
    assert [t for t, _ in rows[0]] == [unlisted, listed[0]]
    assert [t for t, _ in rows[1]] == [0, tied_below]
    assert [t for t, _ in rows[2]] == [3, 2] and [p for _, p in rows[2]] == pytest.approx([0.4, 0.3])
    assert [p for _, p in rows[0]] == pytest.approx([0.3, 0.3])


@pytest.mark.parametrize("drafter_dtype", [torch.float32, torch.bfloat16])
def test_greedy_explanations_name_the_decided_tokens_first(golden_dir, golden_pair, golden_expected, drafter_dtype):
    """Every golden case, every block: the listed top-1s are the drafts, the accepted tokens and the bonus
    (bf16 drafts tie often, as they did on an AMX CPU)."""
    target, _ = golden_pair
    drafter = DFlashDrafter.from_pretrained(golden_dir / "drafter", dtype=drafter_dtype)
    for case in golden_expected["prompts"]:
        summary = run(target, case["prompt_ids"], drafter, max_new_tokens=40, block_size=8, explain=3)
        for block in summary.blocks:
            info = block.explain
            assert [row[0][0] for row in info.draft_topk] == list(block.draft_ids)
            decided = list(block.draft_ids[: block.accepted]) + [block.bonus_id]
            assert [row[0][0] for row in info.target_topk[: len(decided)]] == decided
